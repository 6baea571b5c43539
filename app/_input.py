"""Asking the client for input on either era: server-to-client requests, or
input-required results.

Theory of operation
-------------------
A handler asks its client for something -- a model's completion
(``sampling/createMessage``), the user's answer (``elicitation/create``), the
client's roots (``roots/list``) -- with one API, :meth:`Context.request` and
:meth:`Context.input`, on both wire eras:

* **Session era**: each ask is a server-to-client request on the call's stream;
  the handler waits for the answer.
* **Sessionless era** (2026-07-28): a response stream carries no requests.  Each
  ask has a *key*; if the request already carries the answer under that key (the
  client's ``inputResponses``, or the answers of earlier rounds that the sealed
  ``requestState`` brought back), the handler gets it at once.  Otherwise the ask
  raises :class:`InputRequired` with every missing ask of that :meth:`Context.input`
  call; the driver answers with an ``input_required`` result, and the client
  re-issues the request with the answers, which runs the handler again from the
  start.  So a handler must ask in the same order each run (it normally does:
  what it asks depends on its arguments and the answers so far).

An answer of the wrong shape (not an object, or an elicitation result without
``action``) counts as missing: the client is asked again.  An ask for a capability
the client did not declare on *this* request is refused (-32021,
``data.requiredCapabilities``) instead of being asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._registry import McpError

#: The client capability each kind of ask needs.
CAPABILITY_OF: Final = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
#: JSON-RPC code for a request that needs a client capability it did not declare.
MISSING_CAPABILITY: Final = -32021


class InputRequired(BaseException):
    """The handler needs the client's input first (sessionless era only).

    A ``BaseException`` so that a handler's own ``except Exception`` does not
    swallow it.  ``requests`` maps each key to ``{"method", "params"}``.
    """

    def __init__(self, requests: dict[str, dict[str, Any]]) -> None:
        super().__init__(", ".join(requests))
        self.requests = requests


class BecomeTask(BaseException):
    """The handler asked to continue as a task (:meth:`Context.become_task`).

    ``answered``: the answers its request's rounds gave so far; the task's runs
    get them again, so the handler's asks are answered at once the next time.
    """

    def __init__(self, answered: dict[str, Any]) -> None:
        super().__init__("become a task")
        self.answered = answered


def valid_answer(method: str, answer: object) -> bool:
    """Is ``answer`` shaped like a result of ``method``?"""
    if not isinstance(answer, dict):
        return False
    if method == "elicitation/create":
        return isinstance(answer.get("action"), str)
    if method == "sampling/createMessage":
        return "content" in answer and "role" in answer
    if method == "roots/list":
        return isinstance(answer.get("roots"), list)
    return True


def check_capabilities(methods: list[str], declared: Mapping[str, Any]) -> None:
    """Refuse asks for capabilities the client did not declare.

    Raises:
        McpError: -32021 with ``data.requiredCapabilities``.
    """
    missing: dict[str, dict[str, Any]] = {
        cap: {}
        for m in methods
        if (cap := CAPABILITY_OF.get(m)) is not None and not isinstance(declared.get(cap), dict)
    }
    if missing:
        names = ", ".join(sorted(missing))
        raise McpError(
            MISSING_CAPABILITY,
            f"this request needs the client capability {names}, which it did not declare",
            {"requiredCapabilities": missing},
        )
