"""gRPC's wake-ups of the event loop read all at once (api/wakeups.py), on a real grpc.aio server over loopback.

Left as grpc.aio has them, one byte is written a completion and one read a turn of the loop: after a burst (200
agents' messages while the loop was busy) the bytes stay piled up, and once they fill the socket the poller
thread blocks, handing over one completion a turn. Drained, none stay.
"""
from __future__ import annotations

import array
import asyncio
import fcntl
import queue
import socket
import termios
import threading
import time

import grpc

from dispatcher.api.wakeups import _read_all_but_one, drain_wakeups


def _wakeup_socket(loop) -> socket.socket:
    for key in loop._selector.get_map().values():
        reader = key.data[0]
        if reader is not None and ("_handle_events" in repr(reader) or reader._callback is _read_all_but_one):
            return key.fileobj
    raise AssertionError("no gRPC wake-up socket on this loop")


def _piled_up(wakeups: socket.socket) -> int:
    waiting = array.array("i", [0])
    fcntl.ioctl(wakeups.fileno(), termios.FIONREAD, waiting)
    return waiting[0]


def _echo_handlers() -> grpc.GenericRpcHandler:
    async def echo(requests, context):
        async for message in requests:
            yield message
    return grpc.method_handlers_generic_handler("t.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo)})


async def _burst(drain: bool, streams: int = 200) -> tuple[bool, int, int]:
    """`streams` open streams, each sent a message (by a client thread) while the loop is held for 0.3 s: whether
    the drain was put in, and the bytes in the wake-up socket after the hold and after its reader ran once."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_echo_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    loop = asyncio.get_running_loop()
    drained = drain_wakeups(loop) if drain else False
    again = drain_wakeups(loop) if drain else False  # a second call wraps nothing more
    outgoing = [queue.SimpleQueue() for _ in range(streams)]
    warmed, go, echoed = threading.Event(), threading.Event(), []

    def client() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.stream_stream("/t.Echo/Echo")
            calls = [echo(iter(out.get, None)) for out in outgoing]
            for out in outgoing:
                out.put(b"first")
            replies = [next(call) for call in calls]
            warmed.set()
            go.wait(10)
            for out in outgoing:  # while the loop is held
                out.put(b"second")
            replies += [next(call) for call in calls]
            echoed.extend(replies)
            for out in outgoing:
                out.put(None)

    sender = threading.Thread(target=client)
    sender.start()
    try:
        while not warmed.is_set() and sender.is_alive():
            await asyncio.sleep(0.05)
        go.set()
        time.sleep(0.3)  # the loop held: the messages' completions wait in gRPC's queue, their bytes in the socket
        wakeups = _wakeup_socket(loop)
        before = _piled_up(wakeups)
        await asyncio.sleep(0)  # this turn runs the socket's reader once, after this task...
        await asyncio.sleep(0)  # ...which sees what it left
        left = _piled_up(wakeups)
        while sender.is_alive():
            await asyncio.sleep(0.05)
        assert echoed == [b"first"] * streams + [b"second"] * streams
        return drained and not again, before, left
    finally:
        go.set()
        await server.stop(None)


def test_grpcs_wakeups_pile_up_a_byte_a_completion_unless_drained_and_drained_none_stay():
    drained, before, left = asyncio.run(_burst(drain=False))
    # gRPC's own reader takes one byte a turn (were it to take them all, wakeups.py could go).
    assert not drained and before > 100 and left == before - 1
    drained, before, left = asyncio.run(_burst(drain=True))
    assert drained and before > 100 and left < 10
