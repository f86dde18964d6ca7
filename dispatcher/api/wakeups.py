"""gRPC's wake-ups of the event loop, read all at once (a workaround for grpc.aio's PollerCompletionQueue).

grpc.aio hands every completion (a message sent or received, a call taken up) from a poller thread to the
loop through a queue, writing one byte to a socket pair per completion. The loop's reader takes them all
from the queue but reads one byte a turn. Under load the bytes fill the socket's buffer, and then the poller
blocks in write(), delivering one completion a turn of the loop: with many streams open every call, every
agent redialling after a restart, waits in that line (docs/performance.md, issue 26). Reading every
byte but one before grpc's reader runs keeps the socket near empty, so completions flow as fast as they come.
"""
from __future__ import annotations

import array
import asyncio
import fcntl
import socket
import termios

_READER = "PollerCompletionQueue._handle_events"  # grpc's reader callback, as its handle shows it


def drain_wakeups(loop: asyncio.AbstractEventLoop) -> bool:
    """Wrap gRPC's reader of its wake-up socket on `loop` (call on the loop's thread, once the loop has gRPC
    objects): each time it runs, every byte but the one it reads itself is read first. False (nothing changed)
    when the loop has no such reader, as a gRPC that no longer works this way would not."""
    selector = getattr(loop, "_selector", None)  # a selector event loop's (the default); others are left alone
    if selector is None:
        return False
    for key in list(selector.get_map().values()):
        reader = key.data[0]
        if (reader is not None and reader._callback is not _read_all_but_one and _READER in repr(reader)
                and isinstance(key.fileobj, socket.socket)):
            grpc_reader, args = reader._callback, reader._args  # before remove_reader cancels the handle, clearing them
            loop.remove_reader(key.fileobj)
            loop.add_reader(key.fileobj, _read_all_but_one, key.fileobj, grpc_reader, args)
            return True
    return False


def _read_all_but_one(wakeups: socket.socket, grpc_reader, args: tuple) -> None:
    waiting = array.array("i", [0])
    fcntl.ioctl(wakeups.fileno(), termios.FIONREAD, waiting)
    if waiting[0] > 1:
        wakeups.recv(waiting[0] - 1)
    grpc_reader(*args)
