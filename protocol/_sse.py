"""Server-Sent Events: a byte encoder and an incremental decoder.

Theory of operation
-------------------
This module owns the ``text/event-stream`` wire format (WHATWG HTML, section
"Server-sent events", subsections "Parsing an event stream" and "Interpreting an
event stream").  It knows nothing about MCP, sessions or event-id grammar: ids,
event types and payloads are opaque strings here.

**Encoder.**  :func:`encode_event`, :func:`encode_comment` and :func:`encode_retry`
are pure functions from strings to UTF-8 bytes.  Each call produces whole lines,
always terminated by LF, and (by default) a whole *block* ending with a blank line,
so its output can be written to a socket as-is and concatenated freely.  They sit
on the server's hot path, so the common case (single-line data, no extra fields)
takes a fast path that builds the output with one concatenation and one encode.

The encoder refuses input whose meaning would change on the wire: a CR or LF in
``id`` or ``event`` would start a new field, and a NUL in ``id`` makes the whole id
line ignored by receivers.  Line breaks inside ``data`` and comments are legal
and are written as several ``data:``/``:`` lines; note that every CR, LF and CRLF
comes back from a decoder as LF, as the format has only one way to join lines.

**Decoder.**  :class:`SseDecoder` is fed arbitrary chunks of bytes and returns,
in wire order, the :class:`SseEvent` objects dispatched and the
:class:`SseComment` lines seen (the spec ignores comments; weir's client needs
them, for instance ``: replica=<id>``).  It follows the WHATWG rules exactly:

* The stream is UTF-8 with invalid sequences replaced by U+FFFD, and one leading
  BOM is stripped.  CR and LF are ASCII and never occur inside a multi-byte
  sequence, so the decoder splits lines on the raw bytes and decodes each complete
  line on its own; that gives the same text as decoding the whole stream first,
  and a character split across two chunks simply waits in the line buffer.
* Lines end at CRLF, LF or CR.  A CR at the very end of a chunk ends the line at
  once; the decoder then remembers to swallow an LF at the start of the next
  chunk, so a CRLF split across two feeds is one line ending, not two.
* ``field:value`` with one leading space removed from the value; a line without
  a colon is a field name with an empty value; a line starting with a colon is a
  comment; unknown fields are ignored.
* ``data`` appends the value plus LF to the data buffer; ``event`` sets the event
  type; ``id`` sets the last-event-id buffer unless the value contains NUL; and
  ``retry`` sets the reconnection time if the value is all ASCII digits.
* A blank line dispatches.  First the last event id is committed (it persists
  across events: a block without an ``id`` line carries the previous id).  If the
  data buffer is empty -- the block had no ``data`` line at all -- nothing is
  dispatched.  Otherwise one trailing LF is removed from the data buffer and an
  event is produced, with type ``"message"`` if none was given.
* At end of stream (:meth:`SseDecoder.close`) an incomplete line or block is
  discarded.

Mind the difference between "no ``data`` line" and "empty data".  The MCP
priming event ``id: X`` + ``data: `` + blank line has a data buffer of ``"\\n"``
before the trailing LF is removed, so it *is* dispatched, as
``SseEvent(data="", id="X")``.  A block carrying only ``id: X`` or only
``retry: N`` is not dispatched; its effect is visible through
:attr:`SseDecoder.last_event_id` and :attr:`SseDecoder.retry`.

**Limits.**  A peer could send an endless line or an endless event.  The decoder
bounds both: ``max_line_bytes`` caps one line (bytes, terminator excluded) and
``max_event_bytes`` caps the raw bytes of the ``data`` lines of one block.  Going
over either raises :class:`SseDecodeError`.  The limits are checked on complete
lines and on the pending partial line alike, so the outcome does not depend on
how the input was chunked.  After an :class:`SseDecodeError` the decoder is
broken: every later :meth:`~SseDecoder.feed` raises again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "SseComment",
    "SseDecodeError",
    "SseDecoder",
    "SseEvent",
    "SseItem",
    "encode_comment",
    "encode_event",
    "encode_retry",
]

_BOM: Final = b"\xef\xbb\xbf"
# One line terminator: CRLF, lone CR, or LF.  A CR at the very end of the buffer
# matches alone; the decoder handles a following LF in the next chunk.
_EOL: Final = re.compile(rb"\r\n?|\n")
# A retry value with more significant digits than this is far beyond any useful
# reconnection delay (10**18 ms is ~31 million years) and is ignored rather than
# turned into an enormous int (which CPython may refuse: int_max_str_digits).
_MAX_RETRY_DIGITS: Final = 18
_DEFAULT_MAX_LINE_BYTES: Final = 1 << 20
_DEFAULT_MAX_EVENT_BYTES: Final = 16 << 20


# --------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------


def _normalise_newlines(text: str) -> str:
    """Return ``text`` with every CRLF and lone CR turned into LF."""
    if "\r" in text:
        return text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _check_retry(retry: int) -> None:
    # bool is an int subclass but would be written as "True"; refuse it.
    if not isinstance(retry, int) or isinstance(retry, bool):
        raise TypeError(f"SSE retry must be an int, got {type(retry).__name__}")
    if retry < 0:
        raise ValueError(f"SSE retry must be a non-negative number of ms, got {retry}")


def encode_event(
    data: str,
    *,
    id: str | None = None,
    event: str | None = None,
    retry: int | None = None,
) -> bytes:
    """Encode one complete SSE event block as UTF-8.

    Fields are written in the order ``id``, ``event``, ``retry``, ``data``, each as
    ``name: value``, and the block ends with a blank line.  ``data`` is split at
    every CRLF, CR and LF into one ``data:`` line per line, so an empty string
    gives exactly one ``data: `` line (as in the MCP priming event) and a trailing
    newline gives a trailing empty ``data: `` line.  A decoder returns the data
    with every line break as LF.

    Args:
        data: The event payload; any string encodable as UTF-8.
        id: The event id, or None for no ``id`` line.  An empty string is allowed
            and tells the receiver to reset its last event id.
        event: The event type, or None for no ``event`` line (receivers then use
            ``"message"``).
        retry: Reconnection time in milliseconds, or None for no ``retry`` line.

    Returns:
        The encoded block; it always ends with ``b"\\n\\n"``.

    Raises:
        ValueError: ``id`` contains CR, LF or NUL; ``event`` contains CR or LF;
            ``retry`` is negative; or the strings are not encodable as UTF-8
            (:class:`UnicodeEncodeError`, e.g. lone surrogates).
        TypeError: ``retry`` is not an int (``bool`` is refused too).
    """
    if id is None and event is None and retry is None and "\n" not in data and "\r" not in data:
        # Hot path: a single-line payload and nothing else.
        return ("data: " + data + "\n\n").encode()

    parts: list[str] = []
    if id is not None:
        if "\r" in id or "\n" in id or "\0" in id:
            raise ValueError(f"SSE id must not contain CR, LF or NUL: {id!r}")
        parts.append("id: " + id + "\n")
    if event is not None:
        if "\r" in event or "\n" in event:
            raise ValueError(f"SSE event type must not contain CR or LF: {event!r}")
        parts.append("event: " + event + "\n")
    if retry is not None:
        _check_retry(retry)
        parts.append(f"retry: {retry}\n")
    if "\r" in data:
        data = _normalise_newlines(data)
    parts.append("data: " + data.replace("\n", "\ndata: ") + "\n\n")
    return "".join(parts).encode()


def encode_comment(text: str = "", *, blank_line: bool = True) -> bytes:
    """Encode a comment, e.g. a keep-alive or a ``: replica=<id>`` annotation.

    Each line of ``text`` (split at CRLF, CR and LF) is written as ``: line``;
    the empty string gives one ``: `` line.  Receivers following the spec ignore
    comments; :class:`SseDecoder` reports them as :class:`SseComment` with the
    same one-space rule as field values, so ``encode_comment(t)`` decodes back to
    ``t`` (with line breaks as LF).

    Args:
        text: The comment text.
        blank_line: If True (the default), end with a blank line so the comment
            is a block of its own: safe to write between any two events, and the
            boundary at which proxies that buffer per event will flush it -- use
            this for keep-alives.  The blank line dispatches nothing, as the
            data buffer is empty between blocks.  If False, write only the
            comment line(s); that is meant to be immediately followed by an
            event, so the comment and the event form one block.

    Returns:
        The encoded comment.

    Raises:
        ValueError: ``text`` is not encodable as UTF-8.
    """
    if "\r" in text:
        text = _normalise_newlines(text)
    body = ": " + text.replace("\n", "\n: ")
    return (body + ("\n\n" if blank_line else "\n")).encode()


def encode_retry(ms: int) -> bytes:
    """Encode a block carrying only a ``retry`` field, e.g. ``b"retry: 3000\\n\\n"``.

    The block sets the receiver's reconnection time and dispatches no event.

    Args:
        ms: Reconnection time in milliseconds.

    Returns:
        The encoded block.

    Raises:
        TypeError: ``ms`` is not an int (``bool`` is refused too).
        ValueError: ``ms`` is negative.
    """
    _check_retry(ms)
    return f"retry: {ms}\n\n".encode()


# --------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------


def _parse_retry(value: str) -> int | None:
    """Return the ``retry`` value if it is all ASCII digits (and sane), else None."""
    if not (value.isascii() and value.isdigit()):
        return None
    significant = value.lstrip("0")
    if len(significant) > _MAX_RETRY_DIGITS:
        return None
    return int(significant or "0")


class SseDecodeError(ValueError):
    """The event stream broke one of the decoder's size limits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SseEvent:
    """One dispatched event.

    Attributes:
        data: The payload: the ``data`` lines joined with LF.
        event: The event type; ``"message"`` when the block had no (or an empty)
            ``event`` field.
        id: The last event id in force when the event was dispatched -- from this
            block's ``id`` line or, lacking one, the most recent earlier one -- or
            None if the stream has never set an id.
        retry: The reconnection time set by a ``retry`` line in this block, or
            None if the block had none.
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SseComment:
    """One comment line, with the leading colon and one following space removed."""

    text: str


SseItem: TypeAlias = SseEvent | SseComment
"""What :meth:`SseDecoder.feed` yields, in wire order."""


class SseDecoder:
    """Incremental ``text/event-stream`` decoder following the WHATWG rules.

    Feed bytes as they arrive, split anywhere; the items returned over all calls
    are the same however the stream was chunked.  See the module docstring for
    the exact rules.

    Args:
        max_line_bytes: Longest line accepted, in bytes, excluding its line
            terminator (default 1 MiB).  A single ``data`` line holds a whole
            JSON-RPC message, so raise it if larger messages are expected.
        max_event_bytes: Most bytes of ``data`` lines accepted in one block,
            counting each line's field name and a byte for its terminator
            (default 16 MiB).

    Raises:
        ValueError: a limit is not a positive int.
    """

    __slots__ = (
        "_block_retry",
        "_broken",
        "_buffer",
        "_closed",
        "_data",
        "_event_bytes",
        "_event_type",
        "_id_buffer",
        "_last_event_id",
        "_max_event_bytes",
        "_max_line_bytes",
        "_retry",
        "_skip_lf",
        "_start",
    )

    def __init__(
        self,
        *,
        max_line_bytes: int = _DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = _DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        for name, value in (
            ("max_line_bytes", max_line_bytes),
            ("max_event_bytes", max_event_bytes),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self._max_line_bytes = max_line_bytes
        self._max_event_bytes = max_event_bytes
        # Bytes of the current, unterminated line (plus, at stream start, a
        # possibly partial BOM).
        self._buffer = bytearray()
        self._start = True  # no byte past a possible BOM seen yet
        self._skip_lf = False  # previous chunk ended with CR
        self._closed = False
        self._broken: str | None = None
        # The spec's per-block buffers.
        self._data: list[str] = []
        self._event_bytes = 0
        self._event_type = ""
        self._block_retry: int | None = None
        # Persistent state.
        self._id_buffer: str | None = None
        self._last_event_id: str | None = None
        self._retry: int | None = None

    @property
    def last_event_id(self) -> str | None:
        """The last event id committed by a blank line, or None if never set.

        This is the spec's "last event ID string", the value a client sends as
        ``Last-Event-ID`` when it reconnects.  It is updated by every complete
        block, including blocks that dispatch no event (e.g. ``id: X`` followed by
        a blank line), and is not changed by an ``id`` line whose block has not
        ended yet.
        """
        return self._last_event_id

    @property
    def retry(self) -> int | None:
        """The reconnection time in milliseconds from the latest valid ``retry``
        field, or None if the stream has not set one.  Per the spec it takes
        effect as soon as its line is read, even if the block never completes.
        """
        return self._retry

    def feed(self, data: bytes) -> list[SseItem]:
        """Decode the next chunk of the stream.

        Args:
            data: Any number of bytes (including none), split anywhere.

        Returns:
            The events dispatched and the comments seen in this chunk, in order.

        Raises:
            SseDecodeError: a line or an event exceeded its limit.  The decoder is
                then broken, and every later ``feed`` raises again; items
                completed earlier in the same chunk are lost.
            RuntimeError: the decoder was closed.
        """
        if self._broken is not None:
            raise SseDecodeError(f"SSE decoder already failed: {self._broken}")
        if self._closed:
            raise RuntimeError("SSE decoder is closed")
        buffer = self._buffer
        # The buffered bytes hold no line terminator, so the search for one can
        # start at the new bytes; this keeps byte-by-byte feeding linear.
        scan = len(buffer)
        buffer += data
        if self._start:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                return []  # might still become a BOM
            if buffer.startswith(_BOM):
                del buffer[: len(_BOM)]
            self._start = False
            scan = 0
        pos = 0  # start of the current line
        if self._skip_lf and buffer:
            # Only set when the previous chunk was consumed entirely, so the
            # buffer starts with this chunk.
            if buffer[0] == 0x0A:
                pos = scan = 1
            self._skip_lf = False
        items: list[SseItem] = []
        try:
            for match in _EOL.finditer(buffer, scan):
                end = match.start()
                self._check_line(end - pos)
                self._process_line(buffer[pos:end], items)
                pos = match.end()
            if pos == len(buffer) and pos and buffer[pos - 1] == 0x0D:
                # The chunk ended with a CR, which matched alone: if the next
                # chunk starts with LF, that LF completes this CRLF.
                self._skip_lf = True
            del buffer[:pos]
            self._check_line(len(buffer))
        except SseDecodeError as exc:
            self._broken = str(exc)
            raise
        return items

    def close(self) -> list[SseItem]:
        """Signal the end of the stream.

        Any incomplete line or event block is discarded, as the spec requires, so
        nothing is ever returned; the return value exists so a driver can treat
        ``close`` like a final ``feed``.  The persistent state
        (:attr:`last_event_id`, :attr:`retry`) stays readable.  Calling ``close``
        again, or after an error, is harmless.

        Returns:
            An empty list.
        """
        self._closed = True
        self._buffer.clear()
        self._reset_block()
        return []

    # -- internals -----------------------------------------------------------------

    def _check_line(self, nbytes: int) -> None:
        if nbytes > self._max_line_bytes:
            raise SseDecodeError(
                f"SSE line longer than max_line_bytes={self._max_line_bytes} bytes"
            )

    def _reset_block(self) -> None:
        self._data.clear()
        self._event_bytes = 0
        self._event_type = ""
        self._block_retry = None

    def _process_line(self, raw: bytearray, items: list[SseItem]) -> None:
        if not raw:
            self._dispatch(items)
            return
        line = raw.decode("utf-8", "replace")
        colon = line.find(":")
        if colon == 0:
            text = line[1:]
            items.append(SseComment(text=text[1:] if text.startswith(" ") else text))
            return
        if colon < 0:
            name, value = line, ""
        else:
            name = line[:colon]
            value = line[colon + 2 :] if line.startswith(" ", colon + 1) else line[colon + 1 :]
        if name == "data":
            self._event_bytes += len(raw) + 1
            if self._event_bytes > self._max_event_bytes:
                raise SseDecodeError(
                    f"SSE event data longer than max_event_bytes={self._max_event_bytes} bytes"
                )
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\0" not in value:
                self._id_buffer = value
        elif name == "retry":
            retry = _parse_retry(value)
            if retry is not None:
                self._retry = self._block_retry = retry
        # Any other field name is ignored.

    def _dispatch(self, items: list[SseItem]) -> None:
        self._last_event_id = self._id_buffer
        if self._data:
            # The data buffer is the values each followed by LF, minus the final
            # LF: exactly the values joined with LF.
            items.append(
                SseEvent(
                    data="\n".join(self._data),
                    event=self._event_type or "message",
                    id=self._last_event_id,
                    retry=self._block_retry,
                )
            )
        self._reset_block()
