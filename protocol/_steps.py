"""What every course shares: the way a runtime drives it, and field-less effects.

Theory of operation
-------------------
A course is a generator of effects inside a small object.  The runtime asks for
the first effect (:meth:`Steps.start`), performs it, and hands the answer back
(:meth:`Steps.deliver`) -- or the exception performing it raised
(:meth:`Steps.fail`, which lets the course ask for its cleanup effects before the
exception goes on) -- until the course answers ``None``: the request is over.
``now`` comes with every call, so a course reads no clock; it is kept in
:attr:`Steps.now` for the course's own use.

Effects with no fields are preallocated :class:`Singleton` instances, compared
with ``is``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, TypeVar

E = TypeVar("E")


class Steps(Generic[E]):
    """``start`` / ``deliver`` / ``fail`` over one course's generator of effects."""

    __slots__ = ("_send", "_steps", "now")

    def __init__(self) -> None:
        #: The runtime's clock, as of the last call.
        self.now = 0.0

    def _begin(self, steps: Generator[E, Any, None]) -> None:
        # (Set by the subclass once its fields exist: the generator reads them.)
        self._steps = steps
        self._send = steps.send

    def start(self, now: float) -> E | None:
        """The first effect (None: there is nothing to do)."""
        self.now = now
        return next(self._steps, None)

    def deliver(self, answer: object, now: float) -> E | None:
        """The answer to the last effect; the next effect, or None when the course is over."""
        self.now = now
        try:
            return self._send(answer)
        except StopIteration:
            return None

    def fail(self, exc: BaseException, now: float) -> E | None:
        """The last effect raised ``exc``: the effects the course needs to clean up,
        then ``exc`` (or the refusal it became) raised again -- or, where the course
        answers a failure itself, its next effect."""
        self.now = now
        try:
            return self._steps.throw(exc)
        except StopIteration:
            return None


class Singleton:
    """An effect with no fields: one preallocated instance, named in its ``repr``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name
