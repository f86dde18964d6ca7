"""The admin side of the Python client: admin objects, quotas, members, tokens, agents' certificates,
cluster states, audit.

Every call needs an admin token. Results are plain dicts: objects are their docs/api.md documents, the rest
camelCase like the rest of the client. As light as sluice.client: grpc and the stubs only.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from sluice.client import Client, _time
from sluice.config import ClientConfig
from sluice.v1 import admin_pb2, admin_pb2_grpc


def token_dict(token: admin_pb2.Token) -> dict:
    return {"id": token.id, "role": token.role, "subject": token.subject, "cluster": token.cluster or None,
            "createdAt": _time(token.created_at), "expiresAt": _time(token.expires_at),
            "revokedAt": _time(token.revoked_at)}


def certificate_dict(certificate: admin_pb2.RevokedCertificate) -> dict:
    return {"serial": certificate.serial, "cluster": certificate.cluster or None,
            "notAfter": _time(certificate.not_after), "revokedAt": _time(certificate.revoked_at)}


def _change(reply: admin_pb2.ObjectChange) -> dict:
    return {"action": reply.action, "object": json.loads(reply.document_json)}


class AdminClient(Client):
    def __init__(self, config: ClientConfig):
        super().__init__(config)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)

    def apply(self, objects: Iterable, *, dry_run: bool = False) -> list[dict]:
        """Create or update objects (sluice.objects values or documents), all or nothing.

        Returns per object {kind, name, action: create|update|unchanged, diff}."""
        docs = [json.dumps(o if isinstance(o, dict) else o.to_document()) for o in objects]
        reply = self._call(self._admin.Apply, admin_pb2.ApplyRequest(documents_json=docs, dry_run=dry_run))
        return [{"kind": r.kind, "name": r.name, "action": r.action, "diff": r.diff} for r in reply.results]

    def get_objects(self, kind: str, name: str = "") -> list[dict]:
        """Stored documents of a kind ('queue', 'classes', ...), or of one object."""
        reply = self._call(self._admin.GetObjects, admin_pb2.GetObjectsRequest(kind=kind, name=name))
        return [json.loads(d) for d in reply.documents_json]

    def delete(self, kind: str, name: str) -> dict:
        """Delete an object that nothing uses; returns its document."""
        reply = self._call(self._admin.DeleteObject, admin_pb2.DeleteObjectRequest(kind=kind, name=name))
        return json.loads(reply.document_json)

    def set_quota(self, queue: str, guaranteed: dict[str, str] | None = None,
                  max: dict[str, str] | None = None) -> dict:
        """Merge quantities into a queue's quota ("" removes one); returns {action, object}."""
        return _change(self._call(self._admin.SetQuota, admin_pb2.SetQuotaRequest(
            queue=queue, guaranteed=guaranteed or {}, max=max or {})))

    def add_member(self, queue: str, user: str) -> dict:
        return _change(self._call(self._admin.AddMember, admin_pb2.AddMemberRequest(queue=queue, user=user)))

    def create_token(self, role: str, subject: str, cluster: str | None = None, expires_s: int = 0) -> dict:
        """A new token: {id, secret}; the secret is never shown again."""
        reply = self._call(self._admin.CreateToken, admin_pb2.CreateTokenRequest(
            role=role, subject=subject, cluster=cluster or "", expires_seconds=expires_s))
        return {"id": reply.id, "secret": reply.secret}

    def tokens(self) -> list[dict]:
        return [token_dict(t) for t in self._call(self._admin.ListTokens, admin_pb2.ListTokensRequest()).tokens]

    def revoke_token(self, token_id: int) -> dict:
        """Revoke a token; the result says whether it already was (alreadyRevoked)."""
        reply = self._call(self._admin.RevokeToken, admin_pb2.RevokeTokenRequest(id=token_id))
        return {**token_dict(reply.token), "alreadyRevoked": reply.already_revoked}

    def revoke_certificate(self, serial: str, cluster: str | None = None, not_after: datetime | None = None) -> dict:
        """Revoke an agent's client certificate by serial number (hex); the result says whether it already
        was (alreadyRevoked)."""
        request = admin_pb2.RevokeCertificateRequest(serial=serial, cluster=cluster or "")
        if not_after is not None:
            request.not_after.FromDatetime(not_after)
        reply = self._call(self._admin.RevokeCertificate, request)
        return {**certificate_dict(reply.certificate), "alreadyRevoked": reply.already_revoked}

    def revoked_certificates(self) -> list[dict]:
        reply = self._call(self._admin.ListRevokedCertificates, admin_pb2.ListRevokedCertificatesRequest())
        return [certificate_dict(c) for c in reply.certificates]

    def set_cluster_state(self, name: str, state: str) -> str:
        """active (uncordon), cordoned or draining; returns the state it had."""
        return self._call(self._admin.SetClusterState,
                          admin_pb2.SetClusterStateRequest(name=name, state=state)).previous_state

    def audit(self, *, limit: int = 0, after_id: int = 0) -> list[dict]:
        """Admin changes, oldest first: the newest `limit` (default 100), or those after `after_id`."""
        reply = self._call(self._admin.ListAudit, admin_pb2.ListAuditRequest(limit=limit, after_id=after_id))
        return [{"id": r.id, "at": _time(r.at), "actor": r.actor, "action": r.action, "kind": r.kind, "name": r.name,
                 "details": json.loads(r.details_json or "{}")} for r in reply.records]
