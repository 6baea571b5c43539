"""``GET /metrics`` on the asyncio runtime: the Trio engine's Prometheus text.

Theory of operation
-------------------
The counters and the text are :mod:`weir.common`'s :class:`~weir.common.Metrics`,
as on the Trio engine; the asyncio runtime bumps the same counters where it does
the same things (admissions, tool executions, duplicates replayed or still in
progress, refusals by reason, liveness teardowns, idle expiries, dropped client
notifications, credit peaks), hands its sessions to the renderer through
:class:`SessionView` and its retention budget as it is (the retention series).
Left out, because this runtime has no such thing: ``weir_connections_shed_total``,
``weir_accept_errors_total`` and ``weir_connections_parked`` (idle connections keep
their task here)
(no accept loop of its own: ``asyncio.start_server`` accepts, and an over-limit
connection is refused 503 ``overloaded``, counted as a refusal).  The endpoint
answers under the endpoint's Host/Origin rules, GET or HEAD, and needs no token.
With ``--workers N`` it publishes its families every second (:func:`publish_every`)
so that any worker's scrape answers for all (:mod:`weir.common._metrics_share`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from weir.common import Credit, Metered
from weir.protocol import HttpRequest, check_host_and_origin, check_method
from weir.protocol.states import CreditState

if TYPE_CHECKING:
    from ._driver import AsyncioDriver
    from ._session import Session

#: The ``Content-Type`` of the Prometheus text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SessionView:
    """One asyncio session (or sessionless credit owner) as the metrics see it."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def closed(self) -> bool:
        return self._session.closed

    @property
    def half_open(self) -> bool:
        return self._session.flow.credit.state in (CreditState.HALF_OPEN, CreditState.DEAD)

    @property
    def credit(self) -> Credit:
        return self._session.flow.credit

    @property
    def session_id(self) -> str:
        return self._session.sid


class ConnectionCount:
    """The runtime's open connections and their limit (no shedding, no accept loop)."""

    __slots__ = ("_driver",)

    def __init__(self, driver: AsyncioDriver) -> None:
        self._driver = driver

    @property
    def open(self) -> int:
        return self._driver.connections

    @property
    def limit(self) -> int:
        return self._driver.max_connections

    @property
    def shed_total(self) -> None:
        return None

    @property
    def accept_errors(self) -> None:
        return None

    @property
    def parked(self) -> None:
        return None


def view(session: Session) -> Metered:
    """``session`` as :class:`~weir.common.Metrics` reads it."""
    return SessionView(session)


def is_metrics(driver: AsyncioDriver, request: HttpRequest) -> bool:
    """Whether ``request`` asks for the metrics (their path, not the endpoint's)."""
    path = driver.metrics_path
    return path is not None and request.path == path and path != driver.endpoint.path


def answer(driver: AsyncioDriver, request: HttpRequest) -> tuple[int, list[tuple[str, str]], bytes]:
    """The metrics response (status, headers, body).

    Raises:
        RemoteProtocolError: the endpoint's Host/Origin refusals; 405 for a method but GET.
    """
    check_host_and_origin(request.headers, driver.endpoint)
    check_method(request.method, "GET, HEAD")
    sessions, rest = metered(driver)
    body = driver.metrics.render(sessions, **rest)
    return 200, [("content-type", CONTENT_TYPE)], body.encode()


def metered(driver: AsyncioDriver) -> tuple[dict[str, Metered], dict[str, Any]]:
    """What :meth:`Metrics.families` reads of ``driver``: its sessions, and the rest."""
    return {sid: SessionView(s) for sid, s in driver.sessions.items()}, {
        "gate": ConnectionCount(driver),
        "budget": driver.budget,
        "pool": driver.credit_pool,
        "owners": [SessionView(o) for o in driver.owners],
        "listen_streams": len(driver.listeners),
    }


async def publish_every(driver: AsyncioDriver, period: float) -> None:
    """With ``--workers``: publish this worker's metrics for the others' scrapes."""
    while True:
        await asyncio.sleep(period)
        publish(driver)


def publish(driver: AsyncioDriver) -> None:
    """Publish this worker's metrics now (nothing without ``--workers``)."""
    sessions, rest = metered(driver)
    driver.metrics.publish(sessions, **rest)
