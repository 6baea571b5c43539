"""The line grammar of a chunked request body, checked as its bytes arrive.

h11 reads a chunked body leniently where lines are concerned: it ends the
trailer section at a bare LF (``0\\r\\n\\n`` is a complete body to it), joins
obs-fold in trailer fields, and keeps bare CR and control bytes in chunk
extensions and trailer values.  A front end that reads those bytes otherwise
sees another end of the body -- and so another next request -- than this server
does (request smuggling).  :class:`ChunkedCheck` looks at the same bytes first
and names the first such fault; h11 still parses them (sizes, the CRLF after
each chunk's data, field names).

It keeps no bytes: a byte at a time through the lines (chunk-size lines and
trailer fields, which h11 bounds by the head limit), a chunk's data skipped
whole.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

_HEX: Final = MappingProxyType({c: int(chr(c), 16) for c in b"0123456789abcdefABCDEF"})
_MAX_SIZE_DIGITS: Final = 20  # (h11 refuses a longer chunk size)
#: A chunk costs its parsing whatever its size, so a body of one-byte chunks would
#: buy seconds of CPU within the byte limit (4 MiB of them: about 4 s).  A body may
#: have at most ``max(MIN_CHUNKS, max_body // BYTES_PER_CHUNK)`` chunks (8,192 at
#: the default 4 MiB): more is refused as too large, like too many bytes.
BYTES_PER_CHUNK: Final = 512
MIN_CHUNKS: Final = 64
_CR: Final = 0x0D
_LF: Final = 0x0A


class ChunkedCheck:
    """Checks the lines of one chunked body, fed every byte after its head in order.

    Guarantees: :attr:`fault` is set as soon as the bytes that show a bare LF, a
    bare CR, a control byte other than HTAB (in a chunk-size line or a trailer
    field), or obs-fold (a trailer line starting with SP or HTAB) have been fed,
    and never for bytes past the body's end (:attr:`done`: those are the next
    request's).  :attr:`too_large` is set, in the same order, as soon as a
    chunk-size line takes the declared sizes past ``max_body`` or the chunks past
    the chunk bound above (so a fault and an oversized body are told apart the same
    way however the bytes are split, and a body of tiny chunks is bounded in chunks,
    not only in bytes).
    Anything else wrong is left to h11.
    """

    __slots__ = (
        "_chunks",
        "_cr",
        "_line_len",
        "_max",
        "_max_chunks",
        "_size",
        "_sizing",
        "_skip",
        "_total",
        "_trailer",
        "done",
        "fault",
        "too_large",
    )

    def __init__(self, max_body: int) -> None:
        self.fault: str | None = None
        self.too_large = False
        self.done = False
        self._max = max_body
        self._max_chunks = max(MIN_CHUNKS, max_body // BYTES_PER_CHUNK)
        self._chunks = 0  # the chunks so far (the last, empty one not counted)
        self._total = 0  # the sizes of the chunks so far
        self._skip = 0  # data bytes (and their CRLF) still to pass over
        self._trailer = False  # in the trailer section
        self._cr = False  # the last byte was a CR
        self._line_len = 0  # bytes of the current line so far (CR excluded)
        self._size = 0  # the chunk size read so far
        self._sizing = True  # still reading the size's hex digits

    def feed(self, data: bytes | bytearray) -> None:
        """Look at the next bytes of the body (and possibly what follows it)."""
        i, n = 0, len(data)
        while i < n and not (self.done or self.too_large or self.fault is not None):
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            self._byte(data[i])
            i += 1

    def _byte(self, b: int) -> None:
        if self._cr:
            self._cr = False
            if b != _LF:
                self.fault = "bare CR in a chunked body (not followed by LF)"
                return
            self._line_end()
            return
        if b == _CR:
            self._cr = True
            return
        if b == _LF:
            self.fault = "bare LF line end in a chunked body (lines end in CRLF)"
            return
        if (b < 0x20 and b != 0x09) or b == 0x7F:
            self.fault = f"control byte 0x{b:02x} in a chunked body's line"
            return
        if self._trailer and self._line_len == 0 and b in (0x20, 0x09):
            self.fault = "obsolete line folding in a chunked body's trailer"
            return
        self._line_len += 1
        if self._sizing and not self._trailer:
            digit = _HEX.get(b)
            if digit is None or self._line_len > _MAX_SIZE_DIGITS:
                self._sizing = False
            else:
                self._size = self._size * 16 + digit

    def _line_end(self) -> None:
        length, self._line_len = self._line_len, 0
        if self._trailer:
            if length == 0:
                self.done = True  # the blank line: the body ends here
            return
        if self._size == 0:
            self._trailer = True  # the last chunk: trailer fields follow
            self.done = length == 0  # (a size line with no digits: h11 refuses it)
            return
        self._total += self._size
        self._chunks += 1
        self.too_large = self._total > self._max or self._chunks > self._max_chunks
        self._skip = self._size + 2  # the data and its CRLF (h11 checks that)
        self._size = 0
        self._sizing = True
