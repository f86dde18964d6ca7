"""The Schedules service: recurring jobs. Users manage their own schedules, admins every one; the logic is in
dispatcher/services/recurring.py, one transaction per call, with the same auth and error mapping as Jobs."""
from __future__ import annotations

from datetime import UTC, datetime

from dispatcher.api import convert
from dispatcher.api.auth import Authenticator
from dispatcher.api.errors import check_request, translated
from dispatcher.services import recurring
from dispatcher.store.database import Sessions
from sluice.v1 import schedules_pb2, schedules_pb2_grpc

READERS = ("admin", "user")


class SchedulesService(schedules_pb2_grpc.SchedulesServicer):
    def __init__(self, sessions: Sessions, auth: Authenticator):
        self._sessions = sessions
        self._auth = auth

    def _who(self, request, context):
        who = self._auth.require(context, *READERS)
        check_request(request)
        return who

    @translated
    def Create(self, request, context):
        who = self._who(request, context)
        with self._sessions.begin() as session:
            return convert.schedule(recurring.create(session, who, request.document_json, datetime.now(UTC)))

    @translated
    def List(self, request, context):
        who = self._who(request, context)
        with self._sessions() as session:
            views = recurring.list_schedules(session, who, datetime.now(UTC))
        return schedules_pb2.ListSchedulesResponse(schedules=[convert.schedule(v) for v in views])

    @translated
    def Get(self, request, context):
        who = self._who(request, context)
        with self._sessions() as session:
            return convert.schedule(recurring.get(session, who, request.name, datetime.now(UTC)))

    @translated
    def Suspend(self, request, context):
        return self._change(request, context, recurring.suspend)

    @translated
    def Resume(self, request, context):
        return self._change(request, context, recurring.resume)

    @translated
    def Delete(self, request, context):
        return self._change(request, context, recurring.delete)

    def _change(self, request, context, change):
        who = self._who(request, context)
        with self._sessions.begin() as session:
            return convert.schedule(change(session, who, request.name, datetime.now(UTC)))

    @translated
    def Trigger(self, request, context):
        who = self._who(request, context)
        with self._sessions.begin() as session:
            done = recurring.trigger(session, who, request.name, datetime.now(UTC))
            return schedules_pb2.TriggerResponse(schedule=convert.schedule(done.schedule), job_id=done.job_id,
                                                 cancelled=done.cancelled)
