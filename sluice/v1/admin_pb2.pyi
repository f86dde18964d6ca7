import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyRequest(_message.Message):
    __slots__ = ("documents_json", "dry_run")
    DOCUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    documents_json: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    def __init__(self, documents_json: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyResult(_message.Message):
    __slots__ = ("kind", "name", "action", "diff")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    action: str
    diff: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., action: _Optional[str] = ..., diff: _Optional[str] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ApplyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ApplyResult, _Mapping]]] = ...) -> None: ...

class GetObjectsRequest(_message.Message):
    __slots__ = ("kind", "name")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetObjectsResponse(_message.Message):
    __slots__ = ("documents_json",)
    DOCUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    documents_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, documents_json: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteObjectRequest(_message.Message):
    __slots__ = ("kind", "name")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteObjectResponse(_message.Message):
    __slots__ = ("document_json",)
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    def __init__(self, document_json: _Optional[str] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("queue", "guaranteed", "max")
    class GuaranteedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MaxEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    queue: str
    guaranteed: _containers.ScalarMap[str, str]
    max: _containers.ScalarMap[str, str]
    def __init__(self, queue: _Optional[str] = ..., guaranteed: _Optional[_Mapping[str, str]] = ..., max: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ObjectChange(_message.Message):
    __slots__ = ("action", "document_json")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    action: str
    document_json: str
    def __init__(self, action: _Optional[str] = ..., document_json: _Optional[str] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("queue", "user")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    user: str
    def __init__(self, queue: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("role", "subject", "cluster", "expires_seconds")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_SECONDS_FIELD_NUMBER: _ClassVar[int]
    role: str
    subject: str
    cluster: str
    expires_seconds: int
    def __init__(self, role: _Optional[str] = ..., subject: _Optional[str] = ..., cluster: _Optional[str] = ..., expires_seconds: _Optional[int] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("id", "secret")
    ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    id: int
    secret: str
    def __init__(self, id: _Optional[int] = ..., secret: _Optional[str] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "role", "subject", "cluster", "created_at", "expires_at", "revoked_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    role: str
    subject: str
    cluster: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., role: _Optional[str] = ..., subject: _Optional[str] = ..., cluster: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("token", "already_revoked")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ALREADY_REVOKED_FIELD_NUMBER: _ClassVar[int]
    token: Token
    already_revoked: bool
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., already_revoked: _Optional[bool] = ...) -> None: ...

class RevokedCertificate(_message.Message):
    __slots__ = ("serial", "cluster", "not_after", "revoked_at")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    serial: str
    cluster: str
    not_after: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    def __init__(self, serial: _Optional[str] = ..., cluster: _Optional[str] = ..., not_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RevokeCertificateRequest(_message.Message):
    __slots__ = ("serial", "cluster", "not_after")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    serial: str
    cluster: str
    not_after: _timestamp_pb2.Timestamp
    def __init__(self, serial: _Optional[str] = ..., cluster: _Optional[str] = ..., not_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RevokeCertificateResponse(_message.Message):
    __slots__ = ("certificate", "already_revoked")
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    ALREADY_REVOKED_FIELD_NUMBER: _ClassVar[int]
    certificate: RevokedCertificate
    already_revoked: bool
    def __init__(self, certificate: _Optional[_Union[RevokedCertificate, _Mapping]] = ..., already_revoked: _Optional[bool] = ...) -> None: ...

class ListRevokedCertificatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRevokedCertificatesResponse(_message.Message):
    __slots__ = ("certificates",)
    CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    certificates: _containers.RepeatedCompositeFieldContainer[RevokedCertificate]
    def __init__(self, certificates: _Optional[_Iterable[_Union[RevokedCertificate, _Mapping]]] = ...) -> None: ...

class SetClusterStateRequest(_message.Message):
    __slots__ = ("name", "state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class SetClusterStateResponse(_message.Message):
    __slots__ = ("previous_state",)
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    previous_state: str
    def __init__(self, previous_state: _Optional[str] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("limit", "after_id")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    limit: int
    after_id: int
    def __init__(self, limit: _Optional[int] = ..., after_id: _Optional[int] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("id", "at", "actor", "action", "kind", "name", "details_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: _timestamp_pb2.Timestamp
    actor: str
    action: str
    kind: str
    name: str
    details_json: str
    def __init__(self, id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., details_json: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ...) -> None: ...
