import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Job(_message.Message):
    __slots__ = ("id", "name", "queue", "service_class", "priority", "state", "reason", "cluster", "attempt", "created_at", "dispatched_at", "started_at", "finished_at", "labels", "spec_json", "submitted_by", "max_retries", "array_id", "array_index", "interactive", "start_after")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    INTERACTIVE_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    queue: str
    service_class: str
    priority: int
    state: str
    reason: str
    cluster: str
    attempt: int
    created_at: _timestamp_pb2.Timestamp
    dispatched_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    spec_json: str
    submitted_by: str
    max_retries: int
    array_id: int
    array_index: int
    interactive: bool
    start_after: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., queue: _Optional[str] = ..., service_class: _Optional[str] = ..., priority: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., cluster: _Optional[str] = ..., attempt: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dispatched_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., spec_json: _Optional[str] = ..., submitted_by: _Optional[str] = ..., max_retries: _Optional[int] = ..., array_id: _Optional[int] = ..., array_index: _Optional[int] = ..., interactive: _Optional[bool] = ..., start_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("id", "job_id", "attempt", "from_state", "to_state", "reason", "cluster", "at")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    job_id: int
    attempt: int
    from_state: str
    to_state: str
    reason: str
    cluster: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., from_state: _Optional[str] = ..., to_state: _Optional[str] = ..., reason: _Optional[str] = ..., cluster: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("specs_json", "idempotency_key", "more")
    SPECS_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    specs_json: _containers.RepeatedScalarFieldContainer[str]
    idempotency_key: str
    more: bool
    def __init__(self, specs_json: _Optional[_Iterable[str]] = ..., idempotency_key: _Optional[str] = ..., more: _Optional[bool] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("ids", "replayed")
    IDS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    replayed: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class DescribeJobResponse(_message.Message):
    __slots__ = ("job", "events", "queue_position", "attempts", "depends_on", "dependants")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    DEPENDANTS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    queue_position: int
    attempts: _containers.RepeatedCompositeFieldContainer[JobAttempt]
    depends_on: _containers.RepeatedCompositeFieldContainer[JobDependency]
    dependants: _containers.RepeatedCompositeFieldContainer[JobDependency]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., queue_position: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[JobAttempt, _Mapping]]] = ..., depends_on: _Optional[_Iterable[_Union[JobDependency, _Mapping]]] = ..., dependants: _Optional[_Iterable[_Union[JobDependency, _Mapping]]] = ...) -> None: ...

class JobAttempt(_message.Message):
    __slots__ = ("attempt", "cluster", "state", "reason", "dispatched_at", "started_at", "finished_at", "address")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    cluster: str
    state: str
    reason: str
    dispatched_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    address: str
    def __init__(self, attempt: _Optional[int] = ..., cluster: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., dispatched_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., address: _Optional[str] = ...) -> None: ...

class AttachResponse(_message.Message):
    __slots__ = ("job", "address", "idle_timeout_seconds")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    address: str
    idle_timeout_seconds: float
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., address: _Optional[str] = ..., idle_timeout_seconds: _Optional[float] = ...) -> None: ...

class JobDependency(_message.Message):
    __slots__ = ("job_id", "name", "condition", "state", "status")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    name: str
    condition: str
    state: str
    status: str
    def __init__(self, job_id: _Optional[int] = ..., name: _Optional[str] = ..., condition: _Optional[str] = ..., state: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class ClusterVerdict(_message.Message):
    __slots__ = ("cluster", "verdict")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    verdict: str
    def __init__(self, cluster: _Optional[str] = ..., verdict: _Optional[str] = ...) -> None: ...

class BurstDecision(_message.Message):
    __slots__ = ("attempt", "policy", "queue", "cluster", "trigger", "rate_per_hour", "expected_hours", "expected_cost", "starts_in_seconds", "alternatives")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HOURS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COST_FIELD_NUMBER: _ClassVar[int]
    STARTS_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    policy: str
    queue: str
    cluster: str
    trigger: str
    rate_per_hour: float
    expected_hours: float
    expected_cost: float
    starts_in_seconds: float
    alternatives: _containers.RepeatedCompositeFieldContainer[ClusterVerdict]
    def __init__(self, attempt: _Optional[int] = ..., policy: _Optional[str] = ..., queue: _Optional[str] = ..., cluster: _Optional[str] = ..., trigger: _Optional[str] = ..., rate_per_hour: _Optional[float] = ..., expected_hours: _Optional[float] = ..., expected_cost: _Optional[float] = ..., starts_in_seconds: _Optional[float] = ..., alternatives: _Optional[_Iterable[_Union[ClusterVerdict, _Mapping]]] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("job", "queue_position", "quota", "clusters", "bursts")
    JOB_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    BURSTS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    queue_position: int
    quota: str
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterVerdict]
    bursts: _containers.RepeatedCompositeFieldContainer[BurstDecision]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., queue_position: _Optional[int] = ..., quota: _Optional[str] = ..., clusters: _Optional[_Iterable[_Union[ClusterVerdict, _Mapping]]] = ..., bursts: _Optional[_Iterable[_Union[BurstDecision, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("queue", "state", "limit", "page_token", "user", "cluster", "name", "array_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    state: str
    limit: int
    page_token: str
    user: str
    cluster: str
    name: str
    array_id: int
    def __init__(self, queue: _Optional[str] = ..., state: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., user: _Optional[str] = ..., cluster: _Optional[str] = ..., name: _Optional[str] = ..., array_id: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("ids", "array_ids")
    IDS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    array_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., array_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class JobEvents(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job_id", "after_event_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    after_event_id: int
    def __init__(self, job_id: _Optional[int] = ..., after_event_id: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("milli",)
    class MilliEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MILLI_FIELD_NUMBER: _ClassVar[int]
    milli: _containers.ScalarMap[str, int]
    def __init__(self, milli: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ClusterView(_message.Message):
    __slots__ = ("name", "tier", "site", "labels", "state", "capacity_source", "capacity_age_seconds", "allocatable", "free", "largest_free_node", "running_jobs", "connected", "price")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PriceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FREE_NODE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    name: str
    tier: str
    site: str
    labels: _containers.ScalarMap[str, str]
    state: str
    capacity_source: str
    capacity_age_seconds: float
    allocatable: Resources
    free: Resources
    largest_free_node: Resources
    running_jobs: int
    connected: bool
    price: _containers.ScalarMap[str, float]
    def __init__(self, name: _Optional[str] = ..., tier: _Optional[str] = ..., site: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., state: _Optional[str] = ..., capacity_source: _Optional[str] = ..., capacity_age_seconds: _Optional[float] = ..., allocatable: _Optional[_Union[Resources, _Mapping]] = ..., free: _Optional[_Union[Resources, _Mapping]] = ..., largest_free_node: _Optional[_Union[Resources, _Mapping]] = ..., running_jobs: _Optional[int] = ..., connected: _Optional[bool] = ..., price: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ListClustersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClustersResponse(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterView]
    def __init__(self, clusters: _Optional[_Iterable[_Union[ClusterView, _Mapping]]] = ...) -> None: ...

class QueueView(_message.Message):
    __slots__ = ("name", "parent", "guaranteed", "max", "used", "queued_jobs", "running_jobs", "fair_share", "fair_share_rank")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_RANK_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    guaranteed: Resources
    max: Resources
    used: Resources
    queued_jobs: int
    running_jobs: int
    fair_share: float
    fair_share_rank: int
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., guaranteed: _Optional[_Union[Resources, _Mapping]] = ..., max: _Optional[_Union[Resources, _Mapping]] = ..., used: _Optional[_Union[Resources, _Mapping]] = ..., queued_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ..., fair_share: _Optional[float] = ..., fair_share_rank: _Optional[int] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueView]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueView, _Mapping]]] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("since_seconds", "by")
    SINCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    since_seconds: float
    by: str
    def __init__(self, since_seconds: _Optional[float] = ..., by: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("group", "resource_hours", "cost", "attempts")
    class ResourceHoursEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_HOURS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    group: str
    resource_hours: _containers.ScalarMap[str, float]
    cost: float
    attempts: int
    def __init__(self, group: _Optional[str] = ..., resource_hours: _Optional[_Mapping[str, float]] = ..., cost: _Optional[float] = ..., attempts: _Optional[int] = ...) -> None: ...

class BurstBudget(_message.Message):
    __slots__ = ("policy", "queue", "spent_in_window", "attempts", "spent_today", "budget_per_day", "rate_per_hour", "budget_per_hour", "resources_in_use", "max_resources")
    class ResourcesInUseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MaxResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SPENT_IN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SPENT_TODAY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    BUDGET_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_IN_USE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    policy: str
    queue: str
    spent_in_window: float
    attempts: int
    spent_today: float
    budget_per_day: float
    rate_per_hour: float
    budget_per_hour: float
    resources_in_use: _containers.ScalarMap[str, str]
    max_resources: _containers.ScalarMap[str, str]
    def __init__(self, policy: _Optional[str] = ..., queue: _Optional[str] = ..., spent_in_window: _Optional[float] = ..., attempts: _Optional[int] = ..., spent_today: _Optional[float] = ..., budget_per_day: _Optional[float] = ..., rate_per_hour: _Optional[float] = ..., budget_per_hour: _Optional[float] = ..., resources_in_use: _Optional[_Mapping[str, str]] = ..., max_resources: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UsageResponse(_message.Message):
    __slots__ = ("rows", "currency", "window_start", "window_end", "by", "burst")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    currency: str
    window_start: _timestamp_pb2.Timestamp
    window_end: _timestamp_pb2.Timestamp
    by: str
    burst: _containers.RepeatedCompositeFieldContainer[BurstBudget]
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., currency: _Optional[str] = ..., window_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., window_end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., by: _Optional[str] = ..., burst: _Optional[_Iterable[_Union[BurstBudget, _Mapping]]] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("id", "attempt", "pod", "pod_set", "tail_lines", "follow")
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    POD_SET_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    id: int
    attempt: int
    pod: str
    pod_set: str
    tail_lines: int
    follow: bool
    def __init__(self, id: _Optional[int] = ..., attempt: _Optional[int] = ..., pod: _Optional[str] = ..., pod_set: _Optional[str] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("pod", "line")
    POD_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    pod: str
    line: str
    def __init__(self, pod: _Optional[str] = ..., line: _Optional[str] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("lines", "attempt", "cluster")
    LINES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    attempt: int
    cluster: str
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., attempt: _Optional[int] = ..., cluster: _Optional[str] = ...) -> None: ...
