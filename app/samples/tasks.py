"""The conformance app's fixtures for the tasks extension (2026-07-28).

:func:`register` adds the tools the suite's ``tasks-*`` scenarios call, each with
the task support the scenario expects: ``greet`` never runs as a task,
``slow_compute``, ``confirm_delete``, ``multi_input`` and ``protocol_error_job``
may, ``failing_job`` and ``test_tool_with_task`` must -- the last one gathers
its input in the request's own rounds and only then becomes a task.
"""

from __future__ import annotations

from typing import Any

from weir.app import App, Context, McpError, ToolError

CONFIRM_SCHEMA = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean"}},
    "required": ["confirm"],
}
NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
#: The longest a fixture sleeps (seconds), whatever it is asked.
MAX_SECONDS = 300.0


def _content(answer: dict[str, Any]) -> dict[str, Any]:
    content = answer.get("content")
    return content if isinstance(content, dict) else {}


def register(app: App) -> None:
    """Add the tasks fixtures to ``app``."""

    @app.tool()
    async def greet(name: str) -> str:
        """Greets ``name`` at once (never a task)."""
        return f"Hello, {name}!"

    @app.tool(task="optional")
    async def slow_compute(ctx: Context, seconds: float = 1.0, label: str = "") -> str:
        """Works for ``seconds`` (as a task for a client that declared tasks)."""
        await ctx.sleep(min(max(seconds, 0.0), MAX_SECONDS))
        return f"computed {label or 'result'} after {seconds:g} s"

    @app.tool(task="optional")
    async def confirm_delete(ctx: Context, filename: str) -> str:
        """Asks the user to confirm, then 'deletes' ``filename``."""
        answer = await ctx.elicit(f"Delete {filename}?", CONFIRM_SCHEMA, key="confirm")
        if answer.get("action") == "accept" and _content(answer).get("confirm") is True:
            return f"deleted {filename}"
        return f"kept {filename}"

    @app.tool(task="optional")
    async def multi_input(ctx: Context) -> str:
        """Asks two things at once, so two questions are open together."""
        asks = {
            "first": ("elicitation/create", {"message": "First?", "requestedSchema": NAME_SCHEMA}),
            "second": (
                "elicitation/create",
                {"message": "Second?", "requestedSchema": NAME_SCHEMA},
            ),
        }
        answers = await ctx.input(asks)
        names = [str(_content(answers[k]).get("name", "?")) for k in ("first", "second")]
        return "got " + " and ".join(names)

    @app.tool(task="required")
    async def failing_job(ctx: Context) -> str:
        """Always ends in a tool error, after a second."""
        await ctx.sleep(1.0)
        raise ToolError("the job failed, as it always does")

    @app.tool(task="optional")
    async def protocol_error_job(ctx: Context) -> str:
        """Always ends in a protocol-level error."""
        await ctx.sleep(0.1)
        raise McpError(-32603, "the job broke down below the tool")

    @app.tool(task="required", task_upfront=False)
    async def test_tool_with_task(ctx: Context) -> str:
        """Asks for a name in the request's rounds, then goes on as a task."""
        answer = await ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
        ctx.become_task()
        await ctx.sleep(0.5)
        return f"Hello, {_content(answer).get('name', 'friend')}, from a task"
