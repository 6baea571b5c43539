"""A store that answers with malformed data fails closed: 503, one log line, no traceback.

Each test puts a value of the wrong type or shape, on a real Valkey, at a key the
server reads -- the session record, a stream's channel binding, a stored event --
and checks that the request is refused with 503 ``store_unavailable``, that the
server logs one line for it and no traceback, and that the connection still serves
the next request.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager

import coredis
import pytest
import trio

from tests.integration.inprocess import valkey_replicas
from tests.integration.rawhttp import Client as RawClient
from tests.integration.rawhttp import initialize, raw_request
from weir.engine import App, Server, ServerConfig
from weir.engine._redis_store import RedisStore

VERSION = {"mcp-protocol-version": "2025-11-25"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def replicas(url: str, count: int) -> AbstractAsyncContextManager[tuple[list[Server], RedisStore]]:
    """``count`` servers on one Valkey key prefix (and a store to reach their keys)."""
    return valkey_replicas(url, count, App("malformed"), ServerConfig(port=0), label="malformed")


async def priming_cursor(port: int, sid: str) -> str:
    """Open the session's GET stream and return its priming event's id."""
    client = await RawClient.connect(port)
    head = {"mcp-session-id": sid, "accept": "text/event-stream", **VERSION}
    await client.send_raw(raw_request("GET", "/mcp", headers=head))
    seen = b""
    with trio.fail_after(10):
        while b"\n" not in seen.partition(b"\nid: ")[2]:
            chunk = await client.stream.receive_some(65536)
            assert chunk, seen
            seen += chunk
    await client.aclose()
    return seen.partition(b"\nid: ")[2].split(b"\n", 1)[0].decode()


def assert_one_line_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    records = [r for r in caplog.records if r.name.startswith("weir")]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
    unavailable = [r for r in records if "store unavailable" in r.getMessage()]
    assert len(unavailable) == 1, [r.getMessage() for r in records]


async def refused_then_served(client: RawClient, sid: str, cursor: str | None) -> None:
    """The corrupted request is 503 store_unavailable; the same connection then
    answers a request that reads nothing corrupted."""
    if cursor is None:
        reply = await client.request("POST", "/mcp", PING, session=sid, headers=VERSION)
    else:
        head = {"accept": "text/event-stream", "last-event-id": cursor, **VERSION}
        reply = await client.request("GET", "/mcp", session=sid, headers=head)
    assert (reply.status, reply.reason) == (503, "store_unavailable"), reply
    fresh = await initialize(client)
    reply = await client.request("POST", "/mcp", PING, session=fresh, headers=VERSION)
    assert reply.status == 200, reply


async def test_a_record_of_the_wrong_type_is_503(
    valkey_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with replicas(valkey_url, 1) as ([server], store):
        with trio.fail_after(20):
            client = await RawClient.connect(server.port)
            sid = await initialize(client)
            record = store._keys("anonymous", sid)[0]
            async with coredis.Redis.from_url(valkey_url, decode_responses=False) as raw:
                await raw.delete([record])
                await raw.set(record, b"not a hash")
            server.sessions.clear()  # as on a replica that never saw it: read the store
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="weir"):
                await refused_then_served(client, sid, None)
            assert_one_line_no_traceback(caplog)
            await client.aclose()


@pytest.mark.parametrize("where", ["binding", "event"])
async def test_a_malformed_stream_is_503_on_another_replica(
    where: str, valkey_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cursor of replica A's stream, resumed on replica B (which reads the store):
    ``binding``: the stream's channel binding in the record is not a number;
    ``event``: a stored event's binding field is not a number."""
    async with replicas(valkey_url, 2) as ([a, b], store):
        with trio.fail_after(20):
            setup = await RawClient.connect(a.port)
            sid = await initialize(setup)
            await setup.aclose()
            cursor = await priming_cursor(a.port, sid)
            epoch = cursor.partition(":")[0]
            record = store._keys("anonymous", sid)[0]
            stream = store._stream_key("anonymous", sid, epoch)
            async with coredis.Redis.from_url(valkey_url, decode_responses=False) as raw:
                if where == "binding":
                    await raw.hset(record, {f"b:{epoch}": "not a number"})
                else:
                    fields = {"d": "{}", "f": "0", "b": "not a number", "r": ""}
                    await raw.xadd(stream, fields, identifier="2-0")
            client = await RawClient.connect(b.port)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="weir"):
                await refused_then_served(client, sid, cursor)
            assert_one_line_no_traceback(caplog)
            await client.aclose()


async def test_a_malformed_event_mid_stream_ends_the_stream_with_one_line(
    valkey_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica B already answered 200 and tails A's stream from the store when a
    malformed event appears: no 503 is possible any more, so the stream's connection
    ends -- with one log line, no traceback -- and B serves the next connection."""
    async with replicas(valkey_url, 2) as ([a, b], store):
        with trio.fail_after(20):
            setup = await RawClient.connect(a.port)
            sid = await initialize(setup)
            await setup.aclose()
            cursor = await priming_cursor(a.port, sid)
            stream = store._stream_key("anonymous", sid, cursor.partition(":")[0])
            tail = await RawClient.connect(b.port)
            head = {"mcp-session-id": sid, "accept": "text/event-stream", "last-event-id": cursor}
            await tail.send_raw(raw_request("GET", "/mcp", headers={**head, **VERSION}))
            seen = b""
            while b"\r\n\r\n" not in seen:
                chunk = await tail.stream.receive_some(65536)
                assert chunk, seen
                seen += chunk
            assert seen.startswith(b"HTTP/1.1 200"), seen
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="weir"):
                async with coredis.Redis.from_url(valkey_url, decode_responses=False) as raw:
                    fields = {"d": "{}", "f": "0", "b": "not a number", "r": ""}
                    await raw.xadd(stream, fields, identifier="2-0")
                assert await tail.closed_by_peer(timeout=10)
                fresh = await RawClient.connect(b.port)
                other = await initialize(fresh)
                reply = await fresh.request("POST", "/mcp", PING, session=other, headers=VERSION)
                assert reply.status == 200, reply
                await fresh.aclose()
            assert_one_line_no_traceback(caplog)
            await tail.aclose()
