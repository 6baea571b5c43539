"""One logical request of the session-era client, and the contiguity of its events.

Theory of operation
-------------------
**One logical request** (an :class:`Exchange`) can take several HTTP exchanges: the
POST, re-POSTs of a keyed call, and resume GETs (driven by :mod:`engine._client_loop`).
The exchange keeps what must survive them: the JSON-RPC id of the latest POST, the
idempotency key (also the ``progressToken``, so re-sends are byte-for-byte the same
request), whether the server ever accepted it (answered 200: from then on a request
without a key is never POSTed again), the newest cursor and the server's ``retry`` hint.

**Contiguity (event ids).**  Every weir event is preceded by ``: replica=<id>`` and
carries the id ``<epoch>:<seq>``.  Across all reconnects of one stream the client
requires the first event to be ``seq`` 0 and each following one to be exactly the
previous ``seq + 1`` on the same epoch.  The replica may change (any replica serves
a shared store); a gap, a repeat, a decrease, another epoch or a switch between
namespaced and foreign ids raises :class:`StreamResumeViolation`.  Every observed
``(replica, epoch, seq)`` is recorded in the call's :class:`CallTrace`.  Ids outside
weir's namespace (other servers) are used as opaque cursors and not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from ._client_common import (
    _EVENT_ID,
    CallTrace,
    JsonObject,
    ObservedEvent,
    ProgressCallback,
    StreamResumeViolation,
)

__all__ = ["Contiguity", "Exchange"]


# ---------------------------------------------------------------------------- contiguity
class Contiguity:
    """Checks the (replica, epoch, seq) of one logical stream across reconnects."""

    def __init__(self, observed: list[ObservedEvent]) -> None:
        self.observed = observed
        self.replica: str | None = None  # from the latest ``: replica=`` comment
        self.last: tuple[str, int] | None = None
        self.namespaced: bool | None = None

    def comment(self, text: str) -> None:
        if text.startswith("replica="):
            self.replica = text[len("replica=") :]

    def event(self, event_id: str | None) -> None:
        """Record one dispatched event.

        Raises:
            StreamResumeViolation: a gap, repeat, decrease, other epoch or mixed ids.
        """
        replica, self.replica = self.replica, None
        if event_id is None:
            if self.namespaced:
                self._violation("an event without an id on a stream with ids")
            return
        match = _EVENT_ID.fullmatch(event_id)
        if match is None:
            if self.namespaced:
                self._violation(f"event id {event_id!r} left the <epoch>:<seq> namespace")
            self.namespaced = False
            return
        if self.namespaced is False:
            self._violation(f"event id {event_id!r} after ids outside the namespace")
        self.namespaced = True
        epoch, seq = match.group(1), int(match.group(2))
        self.observed.append((replica, epoch, seq))
        expected = (epoch, 0) if self.last is None else (self.last[0], self.last[1] + 1)
        if (epoch, seq) != expected:
            kind = (
                "another epoch"
                if epoch != expected[0]
                else "a gap"
                if seq > expected[1]
                else "a repeat"
                if seq == expected[1] - 1
                else "a decrease"
            )
            self._violation(
                f"{kind}: got {epoch}:{seq} from replica {replica!r}, "
                f"expected {expected[0]}:{expected[1]}"
            )
        self.last = (epoch, seq)

    def _violation(self, message: str) -> None:
        raise StreamResumeViolation(message, list(self.observed))


# ---------------------------------------------------------------------------- exchanges
@dataclass(slots=True)
class Exchange:
    """One logical request across its HTTP exchanges (POSTs, resume GETs)."""

    method: str
    params: JsonObject | None
    key: str | None
    on_progress: ProgressCallback | None
    trace: CallTrace
    with_token: bool = True  # False for the rebind handshake itself
    may_rebind: bool = True
    rid: int = 0
    accepted: bool = False  # a POST of it was answered 200: the server may have run it
    cursor: str | None = None
    retry_ms: int | None = None
    contiguity: Contiguity | None = None
    head: dict[str, str] = field(default_factory=dict)  # headers of the POST's answer

    @property
    def progress_token(self) -> str | None:
        if self.key is not None:
            return self.key
        return f"weir-{self.rid}" if self.on_progress is not None else None

    @property
    def resendable(self) -> bool:
        """May it be POSTed again?  Not once accepted without a key: nothing would stop
        the server from running it twice."""
        return self.key is not None or not self.accepted

    def body(self) -> bytes:
        params = dict(self.params) if self.params is not None else None
        token = self.progress_token
        if token is not None:
            params = params or {}
            meta = dict(params.get("_meta") or {})
            meta["progressToken"] = token
            params["_meta"] = meta
        msg: JsonObject = {"jsonrpc": "2.0", "id": self.rid, "method": self.method}
        if params is not None:
            msg["params"] = params
        return msgspec.json.encode(msg)

    def new_stream(self) -> None:
        self.cursor = None
        self.retry_ms = None
        self.contiguity = Contiguity(self.trace.observed_events)
