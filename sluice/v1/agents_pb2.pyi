import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sluice.v1 import jobs_pb2 as _jobs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Capacity(_message.Message):
    __slots__ = ("allocatable", "free", "largest_free_node", "applied_through", "node_free", "node_names")
    ALLOCATABLE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FREE_NODE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_THROUGH_FIELD_NUMBER: _ClassVar[int]
    NODE_FREE_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    allocatable: _jobs_pb2.Resources
    free: _jobs_pb2.Resources
    largest_free_node: _jobs_pb2.Resources
    applied_through: int
    node_free: _containers.RepeatedCompositeFieldContainer[_jobs_pb2.Resources]
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allocatable: _Optional[_Union[_jobs_pb2.Resources, _Mapping]] = ..., free: _Optional[_Union[_jobs_pb2.Resources, _Mapping]] = ..., largest_free_node: _Optional[_Union[_jobs_pb2.Resources, _Mapping]] = ..., applied_through: _Optional[int] = ..., node_free: _Optional[_Iterable[_Union[_jobs_pb2.Resources, _Mapping]]] = ..., node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRoom(_message.Message):
    __slots__ = ("node", "held")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    node: str
    held: _jobs_pb2.Resources
    def __init__(self, node: _Optional[str] = ..., held: _Optional[_Union[_jobs_pb2.Resources, _Mapping]] = ...) -> None: ...

class AttemptStatus(_message.Message):
    __slots__ = ("job_id", "attempt", "state", "reason", "exit_code", "at", "address", "nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    state: str
    reason: str
    exit_code: int
    at: _timestamp_pb2.Timestamp
    address: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeRoom]
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., exit_code: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., address: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeRoom, _Mapping]]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("cluster", "agent_version", "inventory", "capacity", "reads_batches")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    READS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    agent_version: str
    inventory: _containers.RepeatedCompositeFieldContainer[AttemptStatus]
    capacity: Capacity
    reads_batches: bool
    def __init__(self, cluster: _Optional[str] = ..., agent_version: _Optional[str] = ..., inventory: _Optional[_Iterable[_Union[AttemptStatus, _Mapping]]] = ..., capacity: _Optional[_Union[Capacity, _Mapping]] = ..., reads_batches: _Optional[bool] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("capacity",)
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    capacity: Capacity
    def __init__(self, capacity: _Optional[_Union[Capacity, _Mapping]] = ...) -> None: ...

class StatusReport(_message.Message):
    __slots__ = ("seq", "status")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    status: AttemptStatus
    def __init__(self, seq: _Optional[int] = ..., status: _Optional[_Union[AttemptStatus, _Mapping]] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("command_ids",)
    COMMAND_IDS_FIELD_NUMBER: _ClassVar[int]
    command_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, command_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "status", "ack", "batch", "log_lines", "intake", "admin_resources")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LOG_LINES_FIELD_NUMBER: _ClassVar[int]
    INTAKE_FIELD_NUMBER: _ClassVar[int]
    ADMIN_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    status: StatusReport
    ack: CommandAck
    batch: AgentMessages
    log_lines: PodLogLines
    intake: Intake
    admin_resources: AdminResources
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., status: _Optional[_Union[StatusReport, _Mapping]] = ..., ack: _Optional[_Union[CommandAck, _Mapping]] = ..., batch: _Optional[_Union[AgentMessages, _Mapping]] = ..., log_lines: _Optional[_Union[PodLogLines, _Mapping]] = ..., intake: _Optional[_Union[Intake, _Mapping]] = ..., admin_resources: _Optional[_Union[AdminResources, _Mapping]] = ...) -> None: ...

class AgentMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[AgentMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[AgentMessage, _Mapping]]] = ...) -> None: ...

class DispatchAttempt(_message.Message):
    __slots__ = ("job_id", "attempt", "spec_json", "avoid_nodes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    AVOID_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    spec_json: str
    avoid_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., spec_json: _Optional[str] = ..., avoid_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelAttempt(_message.Message):
    __slots__ = ("job_id", "attempt", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class LogRequest(_message.Message):
    __slots__ = ("request_id", "job_id", "attempt", "pod", "pod_set", "tail_lines", "follow")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    POD_SET_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    job_id: int
    attempt: int
    pod: str
    pod_set: str
    tail_lines: int
    follow: bool
    def __init__(self, request_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., pod: _Optional[str] = ..., pod_set: _Optional[str] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogStop(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class PodLogLines(_message.Message):
    __slots__ = ("request_id", "lines", "end", "error", "gone")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    lines: _containers.RepeatedCompositeFieldContainer[_jobs_pb2.LogLine]
    end: bool
    error: str
    gone: bool
    def __init__(self, request_id: _Optional[int] = ..., lines: _Optional[_Iterable[_Union[_jobs_pb2.LogLine, _Mapping]]] = ..., end: _Optional[bool] = ..., error: _Optional[str] = ..., gone: _Optional[bool] = ...) -> None: ...

class IntakeJob(_message.Message):
    __slots__ = ("uid", "namespace", "name", "document_json", "deleting")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    uid: str
    namespace: str
    name: str
    document_json: str
    deleting: bool
    def __init__(self, uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., document_json: _Optional[str] = ..., deleting: _Optional[bool] = ...) -> None: ...

class Intake(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[IntakeJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[IntakeJob, _Mapping]]] = ...) -> None: ...

class IntakeAnswer(_message.Message):
    __slots__ = ("uid", "job_id", "state", "reason", "cluster", "attempt", "error")
    UID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    uid: str
    job_id: int
    state: str
    reason: str
    cluster: str
    attempt: int
    error: str
    def __init__(self, uid: _Optional[str] = ..., job_id: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., cluster: _Optional[str] = ..., attempt: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class IntakeAnswers(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[IntakeAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[IntakeAnswer, _Mapping]]] = ...) -> None: ...

class AdminResource(_message.Message):
    __slots__ = ("kind", "name", "document_json", "deleting")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    DELETING_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    document_json: str
    deleting: bool
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., document_json: _Optional[str] = ..., deleting: _Optional[bool] = ...) -> None: ...

class AdminResources(_message.Message):
    __slots__ = ("resources",)
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[AdminResource]
    def __init__(self, resources: _Optional[_Iterable[_Union[AdminResource, _Mapping]]] = ...) -> None: ...

class AdminOutcome(_message.Message):
    __slots__ = ("kind", "name", "accepted", "message", "deleted", "guaranteed", "max", "used")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    accepted: bool
    message: str
    deleted: bool
    guaranteed: str
    max: str
    used: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., accepted: _Optional[bool] = ..., message: _Optional[str] = ..., deleted: _Optional[bool] = ..., guaranteed: _Optional[str] = ..., max: _Optional[str] = ..., used: _Optional[str] = ...) -> None: ...

class AdminOutcomes(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[AdminOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[AdminOutcome, _Mapping]]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "dispatch", "cancel")
    ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    id: int
    dispatch: DispatchAttempt
    cancel: CancelAttempt
    def __init__(self, id: _Optional[int] = ..., dispatch: _Optional[_Union[DispatchAttempt, _Mapping]] = ..., cancel: _Optional[_Union[CancelAttempt, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("cluster", "heartbeat_seconds", "cluster_spec_json", "reads_batches", "takes_intake", "takes_admin_resources")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    READS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    TAKES_INTAKE_FIELD_NUMBER: _ClassVar[int]
    TAKES_ADMIN_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    heartbeat_seconds: int
    cluster_spec_json: str
    reads_batches: bool
    takes_intake: bool
    takes_admin_resources: bool
    def __init__(self, cluster: _Optional[str] = ..., heartbeat_seconds: _Optional[int] = ..., cluster_spec_json: _Optional[str] = ..., reads_batches: _Optional[bool] = ..., takes_intake: _Optional[bool] = ..., takes_admin_resources: _Optional[bool] = ...) -> None: ...

class StatusAck(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class DispatcherMessage(_message.Message):
    __slots__ = ("welcome", "command", "status_ack", "batch", "logs", "log_stop", "intake_answers", "admin_outcomes")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    STATUS_ACK_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    LOG_STOP_FIELD_NUMBER: _ClassVar[int]
    INTAKE_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    command: Command
    status_ack: StatusAck
    batch: DispatcherMessages
    logs: LogRequest
    log_stop: LogStop
    intake_answers: IntakeAnswers
    admin_outcomes: AdminOutcomes
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., status_ack: _Optional[_Union[StatusAck, _Mapping]] = ..., batch: _Optional[_Union[DispatcherMessages, _Mapping]] = ..., logs: _Optional[_Union[LogRequest, _Mapping]] = ..., log_stop: _Optional[_Union[LogStop, _Mapping]] = ..., intake_answers: _Optional[_Union[IntakeAnswers, _Mapping]] = ..., admin_outcomes: _Optional[_Union[AdminOutcomes, _Mapping]] = ...) -> None: ...

class DispatcherMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[DispatcherMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[DispatcherMessage, _Mapping]]] = ...) -> None: ...
