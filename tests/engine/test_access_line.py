"""The access log's short way to stderr writes exactly the line ``logging`` would.

``weir serve`` configures one stderr handler (:func:`weir.common._logs.configure`);
while nothing else would see an access line, :class:`~weir.common._access.AccessRecord`
writes it straight to that handler's stream instead of building a ``LogRecord``.
Here both ways write the same record (a filter on the access logger forces the
``logging`` way) and the lines must be equal but for the time; and a handler of
the embedder's own on the access logger must still get every line.

Clock: the lines' times are not compared (real time).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from weir.common._access import ACCESS, AccessRecord
from weir.common._logs import DIRECT, configure
from weir.protocol._http_events import Headers

from .logstate import logging_restored

BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}'


@pytest.fixture
def stderr_logs() -> Iterator[io.StringIO]:
    """A buffer for ``configure``'s handler; logging put back after."""
    with logging_restored():
        yield io.StringIO()


def _record() -> AccessRecord:
    headers = Headers.from_raw(
        [(b"host", b"127.0.0.1"), (b"mcp-method", b"tools/call"), (b"mcp-name", b"echo")]
    )
    record = AccessRecord.begin(
        "POST", "/mcp", headers, BODY, peer="127.0.0.1:5000", now=10.0, written=0
    )
    record.end(200, b"", now=10.25, written=321)
    return record


def _both_ways(fmt: str, buffer: io.StringIO) -> list[str]:
    configure("warning", fmt=fmt, worker="w-1", access=True)
    assert DIRECT.handler is not None
    DIRECT.handler.setStream(buffer)
    record = _record()
    record.emit()  # the short way
    ACCESS.addFilter(lambda r: True)  # (someone else's filter: the logging way)
    record.emit()
    return buffer.getvalue().splitlines()


def test_text_lines_are_the_same_both_ways(stderr_logs: io.StringIO) -> None:
    short, logged = _both_ways("text", stderr_logs)
    # "<time> INFO [w-1] weir.access: POST /mcp ...": equal after the time.
    assert short.split(" ", 1)[1] == logged.split(" ", 1)[1], (short, logged)
    assert " INFO [w-1] weir.access: POST /mcp mcp=tools/call tool=echo status=200 " in short
    assert "ms=250.000 bytes=321" in short


def test_json_lines_are_the_same_both_ways(stderr_logs: io.StringIO) -> None:
    short, logged = (json.loads(line) for line in _both_ways("json", stderr_logs))
    short.pop("ts")
    logged.pop("ts")
    assert short == logged
    assert short["status"] == 200 and short["tool"] == "echo" and short["worker"] == "w-1"


def test_a_handler_of_its_own_on_the_access_logger_gets_every_line(
    stderr_logs: io.StringIO,
) -> None:
    configure("warning", fmt="text", worker="main", access=True)
    assert DIRECT.handler is not None
    DIRECT.handler.setStream(stderr_logs)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    ACCESS.addHandler(keep)
    try:
        _record().emit()
    finally:
        ACCESS.removeHandler(keep)
    assert len(seen) == 1 and "status=200" in seen[0].getMessage()
    assert len(stderr_logs.getvalue().splitlines()) == 1  # (and stderr still once)


def test_a_task_id_is_never_logged() -> None:
    headers = Headers.from_raw(
        [(b"host", b"127.0.0.1"), (b"mcp-method", b"tasks/get"), (b"mcp-name", b"SECRET-ID")]
    )
    record = AccessRecord.begin(
        "POST", "/mcp", headers, BODY, peer="127.0.0.1:5000", now=10.0, written=0
    )
    record.end(200, b"", now=10.25, written=321)
    assert record.mcp_method == "tasks/get" and record.tool == "-"
