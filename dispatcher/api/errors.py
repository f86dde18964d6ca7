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
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from dispatcher import errors

log = logging.getLogger(__name__)

CODES = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.AgentUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.SchemaBehind: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_for(exc: errors.DispatcherError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in CODES:
            return CODES[cls]
    return grpc.StatusCode.INTERNAL


def outcome_of(exc: Exception) -> str | None:
    """How a call that raised exc counts in metrics.SUBMIT_OUTCOMES: the caller's mistake (invalid), not allowed
    or over a limit (refused), or the server's own failure (failed); None when the caller went away."""
    if isinstance(exc, grpc.RpcError | grpc.aio.UsageError):
        return None
    if not isinstance(exc, errors.DispatcherError) or isinstance(exc, errors.SchemaBehind):
        return "failed"
    code = status_for(exc)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):  # a document naming no queue, say
        return "invalid"
    return "failed" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL) else "refused"


def internal(exc: BaseException, where: str) -> str:
    """Log an unexpected exception with its traceback under a new error id; the message to send instead."""
    error_id = secrets.token_hex(4)
    log.error("internal error %s in %s", error_id, where, exc_info=exc, extra={"error_id": error_id})
    return f"internal error {error_id}: the dispatcher's log has the details"


def _ending(context, exc: Exception, where: str) -> tuple[grpc.StatusCode, str] | None:
    """The status and words that end the call for exc; None when it needs none (context.abort() raised exc,
    or the client went away while the call read its stream: nobody to tell)."""
    if isinstance(exc, grpc.aio.AbortError) or getattr(context, "code", lambda: None)() is not None:
        return None
    if isinstance(exc, errors.DispatcherError):  # its words may quote a lone surrogate: gRPC sends UTF-8 only
        return status_for(exc), str(exc).encode("utf-8", "backslashreplace").decode()
    if isinstance(exc, grpc.RpcError | grpc.aio.UsageError) and getattr(context, "is_active", lambda: True)() is False:
        return None
    return grpc.StatusCode.INTERNAL, internal(exc, where)


def abort(context: grpc.ServicerContext, exc: Exception, where: str) -> None:
    """End the call for exc (raises): its status when a DispatcherError, INTERNAL with an error id otherwise."""
    if (ending := _ending(context, exc, where)) is None:
        raise exc
    context.abort(*ending)


async def abort_async(context: grpc.aio.ServicerContext, exc: Exception, where: str) -> None:
    """abort() for a handler on the event loop (grpc.aio), whose context.abort is a coroutine."""
    if (ending := _ending(context, exc, where)) is None:
        raise exc
    await context.abort(*ending)


def check_request(message: Message) -> None:
    """InvalidRequest naming the first string field of a request that holds a NUL character: Postgres stores
    none in a text or JSON column, and every string of a request may reach one."""
    if (path := _nul_at(message, "")) is not None:
        raise errors.InvalidRequest(f"{path}: contains a NUL character (\\u0000)")


def _nul_at(message: Message, path: str) -> str | None:
    for field, value in message.ListFields():
        here = f"{path}.{field.name}" if path else field.name
        if field.type == FieldDescriptor.TYPE_STRING:
            for i, item in enumerate(value) if field.is_repeated else ((None, value),):
                if "\x00" in item:
                    return here if i is None else f"{here}[{i}]"
        elif field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        elif field.message_type.GetOptions().map_entry:
            for key, item in value.items():
                at = f"{here}[{key!r}]"
                if isinstance(key, str) and "\x00" in key or isinstance(item, str) and "\x00" in item:
                    return at
                if isinstance(item, Message) and (found := _nul_at(item, at)) is not None:
                    return found
        else:
            for i, item in enumerate(value) if field.is_repeated else ((None, value),):
                if (found := _nul_at(item, here if i is None else f"{here}[{i}]")) is not None:
                    return found
    return None


def translated(method):
    """Wrap a servicer method, unary or streaming (a generator), plain or on the event loop (a coroutine or an
    async generator): a request message (not a stream of them) is first checked by check_request, and every
    exception the method raises ends the call as abort() says."""
    where = method.__qualname__
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def streaming_async(self, request, context):
            try:
                if isinstance(request, Message):
                    check_request(request)
                async for response in method(self, request, context):
                    yield response
            except Exception as exc:
                await abort_async(context, exc, where)
        return streaming_async
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def unary_async(self, request, context):
            try:
                if isinstance(request, Message):
                    check_request(request)
                return await method(self, request, context)
            except Exception as exc:
                await abort_async(context, exc, where)
        return unary_async
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def streaming(self, request, context):
            try:
                if isinstance(request, Message):
                    check_request(request)
                yield from method(self, request, context)
            except Exception as exc:
                abort(context, exc, where)
        return streaming

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            check_request(request)
            return method(self, request, context)
        except Exception as exc:
            abort(context, exc, where)
    return unary
