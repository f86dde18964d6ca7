"""The dispatcher's exceptions: one root, subclasses that say what happened.

The gRPC layer maps each to a status code (dispatcher/api/errors.py); nothing else does.
"""


class DispatcherError(Exception):
    retryable = False


class NotFound(DispatcherError):
    pass


class Conflict(DispatcherError):
    """The object was not in the state the operation expected (a compare-and-set lost)."""


class InvalidRequest(DispatcherError):
    pass


class PermissionDenied(DispatcherError):
    pass


class Unauthenticated(DispatcherError):
    pass


class StoreUnavailable(DispatcherError):
    retryable = True


class SchemaBehind(DispatcherError):
    pass
