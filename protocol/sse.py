"""Server-Sent Events framing and a client-side decoder.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._sse import (
    SseComment,
    SseDecodeError,
    SseDecoder,
    SseEvent,
    encode_comment,
    encode_retry,
)

__all__ = [
    "SseComment",
    "SseDecodeError",
    "SseDecoder",
    "SseEvent",
    "encode_comment",
    "encode_retry",
]
