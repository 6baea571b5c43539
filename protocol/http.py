"""HTTP/1.1 framing extras.  (Public; see :mod:`weir.protocol`.)"""

from __future__ import annotations

from ._http import HeadCache

__all__ = [
    "HeadCache",
]
