"""An SDK app's verifier vouches for a token: weir's principal names one (iss, sub) only.

A verifier of its own may trust several issuers (a multi-tenant app), and the
issuer and subject are whatever the tokens it accepts say.  Two different
(issuer, subject) pairs -- or a pair and a token without an issuer -- must never
become the same principal, or one would reach the other's sessions.  These are
the SDK's own ``AccessToken`` objects, as an app's ``verify_token`` returns them.
"""

from __future__ import annotations

import pytest
from mcp.server.auth.provider import AccessToken as SdkAccessToken

from weir.app._sdk_bridge import _weir_access


def principal(issuer: str | None, subject: str | None, client_id: str = "cli") -> str:
    claims = {} if issuer is None else {"iss": issuer}
    got = SdkAccessToken(token="t", client_id=client_id, scopes=[], subject=subject, claims=claims)
    return _weir_access(got).principal


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("https://a.test", "x#y"), ("https://a.test#x", "y")),
        ((None, "a#b"), ('["cli", null, "a', 'b"]')),
    ],
    ids=["hash-in-issuer", "issuer-shaped-like-a-triple"],
)
def test_different_issuer_and_subject_pairs_are_different_principals(
    one: tuple[str | None, str], other: tuple[str | None, str]
) -> None:
    assert principal(*one) != principal(*other)


def test_a_plain_issuer_keeps_weirs_own_spelling() -> None:
    # (as JwtVerifier spells it: the same user is the same principal either way)
    assert principal("https://issuer.test", "alice") == "https://issuer.test#alice"
