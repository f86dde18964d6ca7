"""The Admin service: admin objects, quotas, members, tokens, cluster states and the audit log.

Every RPC needs an admin token; the logic is in dispatcher/services/administering.py, one transaction per call.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime

from dispatcher.api import convert
from dispatcher.api.auth import Authenticator
from dispatcher.api.errors import translated
from dispatcher.errors import InvalidRequest
from dispatcher.services import administering
from dispatcher.store import tokens
from dispatcher.store.database import Sessions
from sluice.v1 import admin_pb2, admin_pb2_grpc


def _change(change: administering.Change) -> admin_pb2.ObjectChange:
    return admin_pb2.ObjectChange(action=change.action, document_json=json.dumps(change.document))


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, sessions: Sessions, auth: Authenticator):
        self._sessions = sessions
        self._auth = auth

    def _actor(self, context) -> str:
        return self._auth.require(context, "admin").subject

    @translated
    def Apply(self, request, context):
        actor = self._actor(context)
        objects = administering.parse(list(request.documents_json))
        with self._sessions.begin() as session:
            changes = administering.apply(session, actor, objects, dry_run=request.dry_run)
        return admin_pb2.ApplyResponse(results=[
            admin_pb2.ApplyResult(kind=c.kind, name=c.name, action=c.action, diff=c.diff) for c in changes])

    @translated
    def GetObjects(self, request, context):
        self._actor(context)
        with self._sessions() as session:
            docs = administering.get(session, request.kind, request.name)
        return admin_pb2.GetObjectsResponse(documents_json=[json.dumps(d) for d in docs])

    @translated
    def DeleteObject(self, request, context):
        actor = self._actor(context)
        with self._sessions.begin() as session:
            doc = administering.delete(session, actor, request.kind, request.name)
        return admin_pb2.DeleteObjectResponse(document_json=json.dumps(doc))

    @translated
    def SetQuota(self, request, context):
        actor = self._actor(context)
        with self._sessions.begin() as session:
            change = administering.set_quota(session, actor, request.queue, dict(request.guaranteed),
                                             dict(request.max))
        return _change(change)

    @translated
    def AddMember(self, request, context):
        actor = self._actor(context)
        with self._sessions.begin() as session:
            change = administering.add_member(session, actor, request.queue, request.user)
        return _change(change)

    @translated
    def CreateToken(self, request, context):
        actor = self._actor(context)
        with self._sessions.begin() as session:
            token_id, secret = administering.create_token(session, actor, request.role, request.subject,
                                                          request.cluster, request.expires_seconds,
                                                          datetime.now(UTC))
        return admin_pb2.CreateTokenResponse(id=token_id, secret=secret)

    @translated
    def ListTokens(self, request, context):
        self._actor(context)
        with self._sessions() as session:
            return admin_pb2.ListTokensResponse(tokens=[convert.token(t) for t in tokens.list_tokens(session)])

    @translated
    def RevokeToken(self, request, context):
        actor = self._actor(context)
        with self._sessions.begin() as session:
            row, revoked = administering.revoke_token(session, actor, request.id)
        self._auth.forget()  # this process before the reply; the others when the NOTIFY reaches them
        return admin_pb2.RevokeTokenResponse(token=convert.token(row), already_revoked=not revoked)

    @translated
    def RevokeCertificate(self, request, context):
        actor = self._actor(context)
        try:
            not_after = request.not_after.ToDatetime(UTC) if request.HasField("not_after") else None
        except (ValueError, OverflowError):
            raise InvalidRequest("not_after: not a valid time") from None
        with self._sessions.begin() as session:
            row, revoked = administering.revoke_certificate(session, actor, request.serial, request.cluster, not_after)
        self._auth.forget()  # this process before the reply; the others when the NOTIFY reaches them
        return admin_pb2.RevokeCertificateResponse(certificate=convert.revoked_certificate(row),
                                                   already_revoked=not revoked)

    @translated
    def ListRevokedCertificates(self, request, context):
        self._actor(context)
        with self._sessions() as session:
            return admin_pb2.ListRevokedCertificatesResponse(
                certificates=[convert.revoked_certificate(r) for r in tokens.revoked_certificates(session)])

    @translated
    def SetClusterState(self, request, context):
        actor = self._actor(context)
        with self._sessions.begin() as session:
            previous = administering.set_cluster_state(session, actor, request.name, request.state)
        return admin_pb2.SetClusterStateResponse(previous_state=previous)

    @translated
    def ListAudit(self, request, context):
        self._actor(context)
        with self._sessions() as session:
            records = administering.audit(session, limit=request.limit, after_id=request.after_id)
            return admin_pb2.ListAuditResponse(records=[convert.audit_record(r) for r in records])
