"""The App's hooks: what an app provides beyond its registries.

Theory of operation
-------------------
The registries (:class:`~weir.app.App`'s tools, resources, prompts) cover what weir
serves from decorated functions.  These hooks cover the rest, for any app, and are
all the SDK bridge (:mod:`weir.app.sdk`) is made of: a fallback for methods no
registry serves, what ``initialize`` and ``server/discover`` say, tool schemas for
header checks, session-close callbacks, and changes announced from outside a
request.  Each is state on the app; the drivers read it (they never call back into
an app except through these).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, overload

#: Seconds a session's close hooks may run (together) before they are cancelled.
SESSION_CLOSE_WAIT: Final = 5.0
#: Client notifications in the app's hooks at once, per process; past it, one is dropped.
MAX_NOTES_RUNNING: Final = 64
#: Seconds the app's hooks may take over one client notification.
NOTE_WAIT: Final = 5.0


def _change_method(what: str, uri: str | None) -> str:
    """The notification announcing a change of ``what`` (or of resource ``uri``)."""
    if uri is not None:
        return "notifications/resources/updated"
    if what in ("tools", "prompts", "resources"):
        return f"notifications/{what}/list_changed"
    raise ValueError(f"no {what!r} list to change: tools, prompts or resources")


#: ``fallback(method, params, ctx)``: the result of a request the registries do not serve.
Fallback = Callable[[str, dict[str, Any], Any], Awaitable[dict[str, Any]]]
#: ``describe(version)``: ``{"capabilities": …, "serverInfo": …, "instructions": …}``.
Describe = Callable[[str], dict[str, Any]]
#: ``on_session_close(session_id)``: a session ended, or this process stops serving it.
SessionClose = Callable[[str], Awaitable[None]]
#: ``on_notification(method, params, session_id)``: a client's notification for the app.
NotificationHook = Callable[[str, dict[str, Any], str], Awaitable[None]]
#: Where a driver takes announced changes: ``sink(method, uri)``.
ChangeSink = Callable[[str, "str | None"], None]


class AppHooks:
    """The hook half of :class:`~weir.app.App` (see the module docstring)."""

    def _init_hooks(self) -> None:
        #: Requests the registries do not serve (see :meth:`fallback`).
        self.fallback_fn: Fallback | None = None
        #: The fallback serves every method weir does not own, registries unused.
        self.fallback_every_method = False
        #: Overrides the ``initialize`` / ``server/discover`` description (see :meth:`describe`).
        self.describe_fn: Describe | None = None
        self.session_close_fns: list[SessionClose] = []
        self.notification_fns: list[NotificationHook] = []
        #: Input schemas of tools the registry does not hold (see :meth:`tool_schema`).
        self.tool_schema_fn: Callable[[str], Mapping[str, Any] | None] | None = None
        self._change_sinks: dict[object, ChangeSink] = {}

    @overload
    def fallback(self, fn: Fallback, *, every_method: bool = False) -> Fallback: ...
    @overload
    def fallback(
        self, fn: None = None, *, every_method: bool = False
    ) -> Callable[[Fallback], Fallback]: ...
    def fallback(
        self, fn: Fallback | None = None, *, every_method: bool = False
    ) -> Fallback | Callable[[Fallback], Fallback]:
        """Register the handler of requests no registry serves: ``@app.fallback``
        (custom methods) or ``@app.fallback(every_method=True)`` (every method weir
        does not own: the registries are not consulted, ``logging/setLevel`` and
        ``resources/subscribe`` included).

        ``fn(method, params, ctx)`` returns the ``result`` object or raises
        :class:`McpError`.  Methods the transport owns never reach it: ``initialize``,
        ``ping``, ``weir/rebind``, ``server/discover``, ``subscriptions/listen``; nor
        do notifications (see :meth:`on_notification`).  Without a fallback an unknown
        method is -32601.
        """

        def register(f: Fallback) -> Fallback:
            self.fallback_fn = f
            self.fallback_every_method = every_method
            return f

        return register(fn) if fn is not None else register

    def describe(self, fn: Describe) -> Describe:
        """Register what ``initialize`` and ``server/discover`` say about this server:
        ``fn(version)`` returns ``{"capabilities": {...}, "serverInfo": {...},
        "instructions": str | None}`` for the negotiated (or discovered) revision.

        Without it, the capabilities are derived from the registries and
        ``serverInfo`` is ``name`` and ``version``.  The capabilities are asked for
        at every ``initialize`` and ``server/discover``; ``serverInfo``, stamped on
        every 2026-07-28 result, once per server.  The driver still adds what it
        serves itself (the ``experimental`` rebind method on the session era).
        """
        self.describe_fn = fn
        return fn

    def tool_schema(
        self, fn: Callable[[str], Mapping[str, Any] | None]
    ) -> Callable[[str], Mapping[str, Any] | None]:
        """Register ``fn(name)``: the ``inputSchema`` of a tool a fallback serves (None:
        unknown), so that the transport can check the tool's ``Mcp-Param-*`` headers."""
        self.tool_schema_fn = fn
        return fn

    def on_session_close(self, fn: SessionClose) -> SessionClose:
        """Register ``async fn(session_id)``, awaited when a session ends (``DELETE``,
        idle or liveness expiry) or when this process stops serving it (shutdown;
        with a shared store the session may go on elsewhere).  Runs at most once per
        session and process, in the background, cancelled after a few seconds.
        """
        self.session_close_fns.append(fn)
        return fn

    def on_notification(self, fn: NotificationHook) -> NotificationHook:
        """Register ``async fn(method, params, session_id)``, awaited for each notification
        a session-era client sends that is not the transport's own (``initialized``,
        ``cancelled``): ``notifications/roots/list_changed``, custom ones.  Nothing
        answers a notification, so it runs in the background, cancelled after a few
        seconds; past a bound on how many run at once, further ones are dropped.
        """
        self.notification_fns.append(fn)
        return fn

    def changed(self, what: str, uri: str | None = None) -> None:
        """Announce a change from outside any request (a background task, a file
        watcher): the same as :meth:`Context.changed`, delivered by every driver
        serving this app.  Before a driver serves it, nobody listens: a no-op."""
        method = _change_method(what, uri)
        for sink in list(self._change_sinks.values()):
            sink(method, uri)

    def attach_changes(self, sink: ChangeSink) -> Callable[[], None]:
        """For drivers: deliver :meth:`changed` announcements to ``sink(method, uri)``
        until the returned function is called."""
        token = object()
        self._change_sinks[token] = sink
        return lambda: self._change_sinks.pop(token, None) and None
