"""The typed MCP methods both of weir's clients offer, on top of their ``request``.

Theory of operation
-------------------
:class:`McpMethods` is a mixin: a client supplies ``request(method, params)`` (the
raw ``result`` object, after its own retry and resumption rules) and gets
``read_resource``, ``get_prompt`` and the four ``list_*`` methods, each decoding the
answer into a Struct of :mod:`engine._client_types` (:class:`MalformedResponse` when
it does not decode).

**Pagination.**  ``list_tools_page(cursor)`` and its siblings return one page with its
``next_cursor``.  ``list_tools()`` and its siblings follow ``nextCursor`` to the end,
with two bounds so that a broken or hostile server cannot keep the client busy for
ever: at most ``max_pages`` pages (:data:`MAX_PAGES` by default), and no cursor twice
-- a server that hands back a cursor it already gave (a loop) is refused at once.
Both raise :class:`PaginationError`; nothing gathered so far is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from ._client_common import CallTrace, JsonObject, ProgressCallback
from ._client_types import (
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    Page,
    PaginationError,
    Prompt,
    ReadResourceResult,
    Resource,
    ResourceTemplate,
    Tool,
    decode_result,
)

__all__ = ["MAX_PAGES", "McpMethods"]

#: The most pages one ``list_*`` call follows by default.
MAX_PAGES: Final = 1000

P = TypeVar("P", bound=Page)
I = TypeVar("I")  # noqa: E741


class McpMethods:
    """Typed MCP methods over a client's raw ``request`` (see the module docstring)."""

    async def request(
        self,
        method: str,
        params: JsonObject | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        trace: CallTrace | None = None,
    ) -> JsonObject:
        """Send any request; its ``result`` object as it came (implemented by the client)."""
        raise NotImplementedError

    async def read_resource(self, uri: str) -> ReadResourceResult:
        """Read the resource at ``uri``.

        Raises:
            WeirError: the server refused it (:class:`RpcError` for an unknown
                resource), or :class:`MalformedResponse`.
        """
        result = await self.request("resources/read", {"uri": uri})
        return decode_result(ReadResourceResult, result, "resources/read")

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None
    ) -> GetPromptResult:
        """The prompt ``name`` filled in with ``arguments``.

        Raises:
            WeirError: as for :meth:`read_resource`.
        """
        params: JsonObject = {"name": name}
        if arguments is not None:
            params["arguments"] = arguments
        return decode_result(
            GetPromptResult, await self.request("prompts/get", params), "prompts/get"
        )

    # ------------------------------------------------------------------ one page
    async def list_tools_page(self, cursor: str | None = None) -> ListToolsResult:
        """One page of ``tools/list`` (the first when ``cursor`` is None)."""
        return await self._page("tools/list", ListToolsResult, cursor)

    async def list_resources_page(self, cursor: str | None = None) -> ListResourcesResult:
        """One page of ``resources/list``."""
        return await self._page("resources/list", ListResourcesResult, cursor)

    async def list_resource_templates_page(
        self, cursor: str | None = None
    ) -> ListResourceTemplatesResult:
        """One page of ``resources/templates/list``."""
        return await self._page("resources/templates/list", ListResourceTemplatesResult, cursor)

    async def list_prompts_page(self, cursor: str | None = None) -> ListPromptsResult:
        """One page of ``prompts/list``."""
        return await self._page("prompts/list", ListPromptsResult, cursor)

    # ------------------------------------------------------------------ every page
    async def list_tools(self, *, max_pages: int = MAX_PAGES) -> list[Tool]:
        """Every tool, following ``nextCursor`` (bounded: see the module docstring).

        Raises:
            ValueError: ``max_pages`` is below 1.
            PaginationError: a repeated cursor, or more than ``max_pages`` pages.
            WeirError: a refusal or :class:`MalformedResponse` on any page.
        """
        return await self._every("tools/list", ListToolsResult, lambda p: p.tools, max_pages)

    async def list_resources(self, *, max_pages: int = MAX_PAGES) -> list[Resource]:
        """Every resource (as :meth:`list_tools`)."""
        return await self._every(
            "resources/list", ListResourcesResult, lambda p: p.resources, max_pages
        )

    async def list_resource_templates(
        self, *, max_pages: int = MAX_PAGES
    ) -> list[ResourceTemplate]:
        """Every resource template (as :meth:`list_tools`)."""
        return await self._every(
            "resources/templates/list",
            ListResourceTemplatesResult,
            lambda p: p.resource_templates,
            max_pages,
        )

    async def list_prompts(self, *, max_pages: int = MAX_PAGES) -> list[Prompt]:
        """Every prompt (as :meth:`list_tools`)."""
        return await self._every("prompts/list", ListPromptsResult, lambda p: p.prompts, max_pages)

    # ------------------------------------------------------------------ machinery
    async def _page(self, method: str, kind: type[P], cursor: str | None) -> P:
        result = await self.request(method, {"cursor": cursor} if cursor is not None else None)
        return decode_result(kind, result, method)

    async def _every(
        self, method: str, kind: type[P], items: Callable[[P], list[I]], max_pages: int
    ) -> list[I]:
        if max_pages < 1:
            raise ValueError(f"max_pages must be at least 1, not {max_pages}")
        out: list[I] = []
        seen: set[str] = set()
        cursor: str | None = None
        for _ in range(max_pages):
            page = await self._page(method, kind, cursor)
            out.extend(items(page))
            cursor = page.next_cursor
            if not cursor:
                return out
            if cursor in seen:
                raise PaginationError(
                    200, None, f"{method}: the server repeated the cursor {cursor!r} (a loop)"
                )
            seen.add(cursor)
        raise PaginationError(200, None, f"{method}: more than {max_pages} pages")
