import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateScheduleRequest(_message.Message):
    __slots__ = ("document_json",)
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    def __init__(self, document_json: _Optional[str] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScheduleRun(_message.Message):
    __slots__ = ("job_id", "name", "state", "reason", "created_at", "finished_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    name: str
    state: str
    reason: str
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[int] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("name", "owner", "document_json", "suspended", "last_scheduled_at", "next_due_at", "active_job_ids", "runs", "status", "last_error", "last_error_at", "created_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    LAST_SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_DUE_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: str
    document_json: str
    suspended: bool
    last_scheduled_at: _timestamp_pb2.Timestamp
    next_due_at: _timestamp_pb2.Timestamp
    active_job_ids: _containers.RepeatedScalarFieldContainer[int]
    runs: _containers.RepeatedCompositeFieldContainer[ScheduleRun]
    status: str
    last_error: str
    last_error_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[str] = ..., document_json: _Optional[str] = ..., suspended: _Optional[bool] = ..., last_scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_due_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., active_job_ids: _Optional[_Iterable[int]] = ..., runs: _Optional[_Iterable[_Union[ScheduleRun, _Mapping]]] = ..., status: _Optional[str] = ..., last_error: _Optional[str] = ..., last_error_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules",)
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ...) -> None: ...

class TriggerResponse(_message.Message):
    __slots__ = ("schedule", "job_id", "cancelled")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    job_id: int
    cancelled: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., job_id: _Optional[int] = ..., cancelled: _Optional[_Iterable[int]] = ...) -> None: ...
