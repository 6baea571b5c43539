"""The endpoint's individual checks, for drivers that compose their own routing.

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._endpoint import check_host_and_origin, check_json_body, check_method, host_of

__all__ = [
    "check_host_and_origin",
    "check_json_body",
    "check_method",
    "host_of",
]
