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


class ResourceExhausted(DispatcherError):
    """A limit of this dispatcher is reached (open watch streams, agents being admitted); try again later."""
    retryable = True


class StoreUnavailable(DispatcherError):
    retryable = True


class AgentUnavailable(DispatcherError):
    """A cluster's agent is not connected to this dispatcher, or did not answer in time."""
    retryable = True


class SchemaBehind(DispatcherError):
    pass
