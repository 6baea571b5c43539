"""Who one request speaks for: established for that request, never kept on a connection.

Theory of operation
-------------------
The server's authorization step turns each request into a :class:`Requester`
before the request is routed, and everything keyed by an identity takes that value
in hand: session lookups, the sessionless credit owner, the idempotency gate's
namespace, and the binding of sealed request state.  Nothing reads an identity off
the connection: a keep-alive connection (a gateway's, say) may carry Alice's request
and then Bob's, and Bob's request is Bob's.

Without authorization every request speaks for the configured principal
(``ServerConfig.principal``, ``"anonymous"``), and the one thing that tells two
anonymous clients apart is the connection: so a request also names its connection
by :attr:`Requester.connection`, a random id the server draws per connection and
never sends.  An anonymous requester's sessionless credit owner is its connection's
(:attr:`Requester.scope`; see :mod:`engine._sessionless`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Requester:
    """The identity of one request (immutable; built per request by the server).

    Attributes:
        principal: who the request speaks for -- the verified token's principal with
            authorization on, else ``ServerConfig.principal``.
        authorized: a verified token vouched for :attr:`principal`.
        connection: the secret id of the connection the request arrived on (never
            sent to anyone); it scopes what an anonymous request owns.
    """

    principal: str
    authorized: bool
    connection: str

    @property
    def scope(self) -> tuple[str, str]:
        """Whose sessionless credit owner this requester uses: the principal's when
        authorized (shared by all its connections), else the connection's."""
        if self.authorized:
            return (self.principal, "")
        return (self.principal, self.connection)
