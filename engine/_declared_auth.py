"""Serving an app with the authorization it declares itself: :mod:`weir.common`'s
(``common/_declared_auth.py``, shared with the asyncio runtime), re-exported."""

from __future__ import annotations

from weir.common._declared_auth import DeclaredVerifier, declared_authorization

__all__ = ["DeclaredVerifier", "declared_authorization"]
