"""Event ids: an epoch's text form.  (A parsed ``<epoch>:<seq>`` id is the endpoint's
and the courses' business: a driver receives it in :class:`~weir.protocol.OpenStream`.)

(Public; see :mod:`weir.protocol`.)
"""

from __future__ import annotations

from ._event_ids import format_epoch

__all__ = ["format_epoch"]
