"""A POST's messages sorted for the driver; server-to-client request ids.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._messages import Absorbed, absorb, answer_owner, server_request_id

__all__ = [
    "Absorbed",
    "absorb",
    "answer_owner",
    "server_request_id",
]
