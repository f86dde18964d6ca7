"""The one place dispatcher exceptions become gRPC status codes.

Every servicer method is wrapped by `translated` (unary and streaming alike): a DispatcherError ends the call
with its status code and its message, written for people; anything else is a bug, and ends the call with
INTERNAL and a short error id, never the exception's text (which may hold SQL, paths or a secret). The log
holds that id with the traceback.
"""
from __future__ import annotations

import functools
import inspect
import logging
import secrets

import grpc

from dispatcher import errors

log = logging.getLogger(__name__)

CODES = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.SchemaBehind: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_for(exc: errors.DispatcherError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return grpc.StatusCode.INTERNAL


def internal(exc: BaseException, where: str) -> str:
    """Log an unexpected exception with its traceback under a new error id; the message to send instead."""
    error_id = secrets.token_hex(4)
    log.error("internal error %s in %s", error_id, where, exc_info=exc, extra={"error_id": error_id})
    return f"internal error {error_id}: the dispatcher's log has the details"


def abort(context: grpc.ServicerContext, exc: Exception, where: str) -> None:
    """End the call for exc (raises): its status when a DispatcherError, INTERNAL with an error id otherwise."""
    if context.code() is not None:  # context.abort() raised it: the call already has its status
        raise exc
    if isinstance(exc, errors.DispatcherError):
        context.abort(status_for(exc), str(exc))
    if isinstance(exc, grpc.RpcError) and not context.is_active():
        raise exc  # the client went away while the call read its stream: nobody to tell
    context.abort(grpc.StatusCode.INTERNAL, internal(exc, where))


def translated(method):
    """Wrap a servicer method, unary or streaming (a generator): every exception it raises ends the call as
    abort() says."""
    where = method.__qualname__
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def streaming(self, request, context):
            try:
                yield from method(self, request, context)
            except Exception as exc:
                abort(context, exc, where)
        return streaming

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:
            abort(context, exc, where)
    return unary
