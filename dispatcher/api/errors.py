"""The one place dispatcher exceptions become gRPC status codes."""
from __future__ import annotations

import functools
import logging

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


def translated(method):
    """Wrap a unary servicer method: dispatcher errors abort with their code and message."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except errors.DispatcherError as exc:
            context.abort(status_for(exc), str(exc))
    return wrapper
