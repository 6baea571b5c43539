"""The simulated cluster's application: non-idempotent tools that keep a ledger.

Theory of operation
-------------------
Every replica serves the same :func:`make_app`.  Its ``charge`` tool is what weir
exists for: it must run at most once per call, however often the call arrives.  Each
call carries a ``tag`` unique in the whole run (``<client>:<n>``); the tool counts
its executions per tag in the world's :class:`Ledger`, notes which principal ran it,
reports progress between steps (so streams carry several events) and answers
``done <tag>`` -- the client checks that the answer names its own tag.

Tokens are ``tok-<principal>``; :class:`SimVerifier` turns one into its principal and
refuses everything else, so a forged token is a 401.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from weir.engine import AccessToken, App, Context, InvalidToken
from weir.engine._session_store import SessionStore

#: Virtual seconds per step of ``charge``.
STEP = 0.5


@dataclass
class Ledger:
    """What the tools did, by tag."""

    executions: Counter[str] = field(default_factory=Counter)
    #: The principal each tag ran for (the client's name is the tag's prefix).
    ran_for: dict[str, str] = field(default_factory=dict)
    #: Violations seen while tools ran (the world reports them with the rest).
    violations: list[str] = field(default_factory=list)


class SimVerifier:
    """``tok-<name>`` vouches for principal ``<name>``; anything else is invalid."""

    async def verify(self, token: str) -> AccessToken:
        if not token.startswith("tok-") or len(token) < 5:
            raise InvalidToken("unknown token")
        return AccessToken(principal=token[4:])


def make_app(ledger: Ledger, store: SessionStore) -> App:
    """The app every replica serves (see the module docstring).  ``store`` is the
    store model itself (never a replica's handle): the tool asks it, beside the
    replica, whether the session it runs in belongs to its caller."""
    app = App("sim")

    @app.tool()
    async def charge(tag: str, ctx: Context, steps: int = 3) -> str:
        """Non-idempotent: every execution counts."""
        ledger.executions[tag] += 1
        principal = ctx.access_token.principal if ctx.access_token else "?"
        ledger.ran_for[tag] = principal
        if not tag.startswith(f"{principal}:"):
            ledger.violations.append(f"{tag} ran for principal {principal}")
        if ledger.executions[tag] > 1:
            ledger.violations.append(f"{tag} ran {ledger.executions[tag]} times")
        sid = ctx.backend.session_id
        if sid is not None and await store.get_session(principal, sid) is None:
            ledger.violations.append(f"{tag} ran in session {sid[:8]}, not {principal}'s")
        for step in range(1, steps):
            await ctx.sleep(STEP)
            await ctx.report_progress(step, steps)
        await ctx.sleep(STEP)
        return f"done {tag}"

    return app
