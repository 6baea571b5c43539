"""SocketIO: reads and writes on a TCP socket's descriptor, on real sockets."""

from __future__ import annotations

import socket
import struct
from typing import Any, cast

import pytest
import trio
import trio.testing

from weir.engine._connection import GATHER_MIN, RELEASE_MIN, Connection, untaken
from weir.engine._socket_io import GATHER_MAX, socket_io
from weir.protocol import HttpLimits


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = trio.socket.socket()
    await client.connect(listener.getsockname())
    server, _ = await listener.accept()
    listener.close()
    return trio.SocketStream(server), trio.SocketStream(client)


async def test_receive_waits_for_bytes_then_sees_the_peer_close() -> None:
    server, client = await _pair()
    io = socket_io(server)
    assert io is not None
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await io.receive(100))
            got.append(await io.receive(100))

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # nothing sent yet: it waits
        await client.send_all(b"hello")
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"hello"]
        await client.aclose()
    assert got == [b"hello", b""]
    await server.aclose()


async def test_bytes_already_there_are_read_at_once_and_still_checkpoint() -> None:
    server, client = await _pair()
    await client.send_all(b"ready")
    await trio.sleep(0)  # (loopback delivers before the next scheduling round)
    io = socket_io(server)
    assert io is not None
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await io.receive(100)  # cancelled already: nothing is consumed
    assert await io.receive(100) == b"ready"
    await server.aclose()
    await client.aclose()


async def test_a_close_during_the_wait_wakes_the_reader_with_closed_resource() -> None:
    server, client = await _pair()
    io = socket_io(server)
    assert io is not None
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await io.receive(100)

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        await server.aclose()
    await client.aclose()


async def test_a_closed_socket_never_reads_a_reused_descriptor() -> None:
    server, client = await _pair()
    io = socket_io(server)
    assert io is not None
    fd = server.socket.fileno()
    await server.aclose()
    # The kernel hands the lowest free number to the next descriptor: the same one.
    other_a, other_b = socket.socketpair()
    try:
        assert other_a.fileno() == fd or other_b.fileno() == fd
        other_b.send(b"not yours")
        other_a.send(b"not yours")
        with pytest.raises(trio.ClosedResourceError):
            await io.receive(100)
        with pytest.raises(trio.ClosedResourceError):
            await io.send(memoryview(b"x"))
    finally:
        other_a.close()
        other_b.close()
        await client.aclose()


async def test_send_waits_while_the_kernel_is_full_and_resumes_as_the_peer_reads() -> None:
    server, client = await _pair()
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    io = socket_io(server)
    assert io is not None
    payload = b"x" * (1 << 20)
    sent = 0
    async with trio.open_nursery() as nursery:

        async def write() -> None:
            nonlocal sent
            view = memoryview(payload)
            while view:
                n = await io.send(view)
                assert n > 0
                sent += n
                view = view[n:]

        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        assert 0 < sent < len(payload)  # the kernel filled up: the writer waits
        received = 0
        for _ in range(100_000):
            if received == len(payload):
                break
            received += len(await client.receive_some(65536))
    assert sent == received == len(payload)
    await server.aclose()
    await client.aclose()


async def test_a_reset_peer_is_a_broken_resource() -> None:
    server, client = await _pair()
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.send_all(b"partial")
    await client.aclose()  # SO_LINGER 0: the close is a reset
    io = socket_io(server)
    assert io is not None
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(3):
            await io.receive(100)
    await server.aclose()


def test_only_plain_tcp_streams_get_one() -> None:
    class NotASocket(trio.abc.Stream):
        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            raise NotImplementedError

        async def wait_send_all_might_not_block(self) -> None:
            raise NotImplementedError

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            raise NotImplementedError

        async def aclose(self) -> None:
            pass

    assert socket_io(NotASocket()) is None


class _Holder:
    """Stands where a stream handle would: records which frames drained."""

    def __init__(self) -> None:
        self.drained_upto: list[int] = []
        self.session = self  # (progress on a part of a frame lands here)

    def drained(self, upto: int) -> None:
        self.drained_upto.append(upto)

    def progress(self) -> None:
        pass


async def test_pieces_go_out_gathered_in_order_with_marks_where_joined_bytes_put_them() -> None:
    server, client = await _pair()
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    conn = Connection(server, HttpLimits(), notsent_lowat=None)
    # As many pieces as one writev takes, of odd sizes, some empty, well over GATHER_MIN.
    count = GATHER_MAX - 1
    pieces = [b"head"] + [bytes([65 + i % 26]) * (i % 7 and 5000 + 37 * i) for i in range(count)]
    assert sum(map(len, pieces)) > 4 * GATHER_MIN
    joined = b"".join(pieces)
    holder = _Holder()
    ends = [len(b"".join(pieces[: k + 1])) for k in (10, 50)]
    marks = cast(Any, [(ends[0], (holder, 0)), (ends[1], (holder, 1))])
    received = bytearray()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.send, pieces, marks)
            await trio.testing.wait_all_tasks_blocked()
            assert 0 < conn.tracker.written < len(joined)  # the kernel is full: it waits
            for _ in range(100_000):
                if len(received) == len(joined):
                    break
                received += await client.receive_some(65536)
    assert bytes(received) == joined and conn.tracker.written == len(joined)
    for _ in range(200):  # the kernel hears the loopback peer's last ack at once
        if not conn.check_acks():
            break
        await trio.sleep(0.01)
    assert holder.drained_upto == [1, 2]  # both frames, in order: the marks were right
    await server.aclose()
    await client.aclose()


async def test_pieces_to_a_stream_without_a_descriptor_are_joined() -> None:
    server, client = trio.testing.memory_stream_pair()
    conn = Connection(server, HttpLimits(), notsent_lowat=None)
    pieces = [b"a" * GATHER_MIN, b"", b"b" * 10]
    expected = b"".join(pieces)
    received = bytearray()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.send, pieces)
            for _ in range(1000):
                if len(received) == GATHER_MIN + 10:
                    break
                received += await client.receive_some(65536)
    assert bytes(received) == expected and conn.tracker.written == len(received)
    assert pieces == []  # taken over: the caller's list keeps nothing alive


def test_a_cut_piece_is_copied_only_when_that_lets_go_of_more_than_it_copies() -> None:
    # Only the views hold the buffer, and more of it was taken than is left: a copy.
    rest = untaken(memoryview(bytes(200_000)), 150_000)
    assert len(cast(bytes, rest.obj)) == 50_000 and rest == bytes(50_000)
    # Less taken than left: the cut is a view of the same buffer (copying would
    # cost more than it frees; a later cut copies once enough is taken).
    rest = untaken(memoryview(bytes(300_000)), 100_000)
    assert len(cast(bytes, rest.obj)) == 300_000 and len(rest) == 200_000
    # Too little taken to be worth a copy.
    rest = untaken(memoryview(bytes(100_000)), RELEASE_MIN - 1)
    assert len(cast(bytes, rest.obj)) == 100_000
    # Something else keeps the buffer (a stream log's frame): a copy would hold more.
    frame = b"f" * 200_000
    rest = untaken(memoryview(frame), 150_000)
    assert rest.obj is frame and rest == frame[150_000:]
