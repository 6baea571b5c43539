"""The 2026-07-28 input-required tools, and the helpers the input-required prompt shares.

Each tool returns :class:`~mcp.types.InputRequiredResult` until the retry carries
``inputResponses`` (the SDK seals the request state).
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequest,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    SamplingMessage,
    TextContent,
)

from ._media import said

NAME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


def elicit(message: str, schema: dict[str, Any] = NAME_SCHEMA) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> CreateMessageRequest:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=text))
    return CreateMessageRequest(
        params=CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def answer_to(ctx: Context, key: str) -> Any:
    """The client's response to input request ``key``, or None on the first round."""
    return (ctx.input_responses or {}).get(key)


def field(answer: Any, name: str, default: str) -> str:
    if isinstance(answer, ElicitResult) and answer.content and name in answer.content:
        return str(answer.content[name])
    return default


def _model_said(answer: Any) -> str:
    return said(answer) if isinstance(answer, CreateMessageResult) else "(no text)"


async def test_input_required_result_elicitation(ctx: Context) -> str | InputRequiredResult:
    """Asks the user's name (key user_name), then greets them."""
    answer = answer_to(ctx, "user_name")
    if answer is None:
        return InputRequiredResult(input_requests={"user_name": elicit("What is your name?")})
    return f"Hello, {field(answer, 'name', 'friend')}!"


async def test_input_required_result_sampling(ctx: Context) -> str | InputRequiredResult:
    """Asks the client's model a question (key sample_request)."""
    answer = answer_to(ctx, "sample_request")
    if answer is None:
        question = _sample("What is the capital of France?", 100)
        return InputRequiredResult(input_requests={"sample_request": question})
    return f"The model said: {_model_said(answer)}"


async def test_input_required_result_list_roots(ctx: Context) -> str | InputRequiredResult:
    """Asks for the client's roots (key roots_request)."""
    answer = answer_to(ctx, "roots_request")
    if not isinstance(answer, ListRootsResult):
        return InputRequiredResult(input_requests={"roots_request": ListRootsRequest()})
    return "roots: " + ", ".join(str(root.uri) for root in answer.roots)


CONFIRM_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


async def test_input_required_result_request_state(ctx: Context) -> str | InputRequiredResult:
    """Asks for a confirmation (key confirm) and carries request state across the retry."""
    if answer_to(ctx, "confirm") is not None and ctx.request_state == "awaiting-confirmation":
        return "state-ok"
    return InputRequiredResult(
        input_requests={"confirm": elicit("Confirm?", CONFIRM_SCHEMA)},
        request_state="awaiting-confirmation",
    )


async def test_input_required_result_multiple_inputs(ctx: Context) -> str | InputRequiredResult:
    """Asks three things at once (a name, a model's greeting, the roots), with request state."""
    wanted: dict[str, InputRequest] = {
        "user_name": elicit("What is your name?"),
        "greeting": _sample("Say hello.", 50),
        "client_roots": ListRootsRequest(),
    }
    responses = ctx.input_responses or {}
    missing = {key: request for key, request in wanted.items() if key not in responses}
    if missing:
        return InputRequiredResult(input_requests=missing, request_state="gathering-inputs")
    name = field(responses["user_name"], "name", "friend")
    return f"{_model_said(responses['greeting'])}, {name}"


COLOUR_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"color": {"type": "string"}}}


async def test_input_required_result_multi_round(ctx: Context) -> str | InputRequiredResult:
    """Asks in two rounds: a name (key step1), then a colour (key step2).

    The name from round one rides in the request state, which the SDK seals.
    """
    state: dict[str, Any] = json.loads(ctx.request_state) if ctx.request_state else {}
    first, second = answer_to(ctx, "step1"), answer_to(ctx, "step2")
    if state.get("round") == 2 and second is not None:
        return f"{state.get('name', 'friend')} likes {field(second, 'color', 'no colour')}"
    if state.get("round") == 1 and first is not None:
        name = field(first, "name", "friend")
        return InputRequiredResult(
            input_requests={"step2": elicit("Favourite colour?", COLOUR_SCHEMA)},
            request_state=json.dumps({"round": 2, "name": name}),
        )
    return InputRequiredResult(
        input_requests={"step1": elicit("What is your name?")},
        request_state=json.dumps({"round": 1}),
    )


async def test_input_required_result_tampered_state(ctx: Context) -> str | InputRequiredResult:
    """Asks for a confirmation; the SDK refuses a retry whose request state was altered."""
    if ctx.request_state is None:
        return InputRequiredResult(
            input_requests={"confirm": elicit("Confirm?", {"type": "object", "properties": {}})},
            request_state="asked",
        )
    return "confirmed"


async def test_input_required_result_capabilities(ctx: Context) -> str | InputRequiredResult:
    """Asks only for what the client declared: input from the user, or the model."""
    caps = ctx.client_capabilities
    asks: dict[str, InputRequest] = {}
    if caps is not None and caps.elicitation is not None:
        asks["elicit_input"] = elicit("What is your name?")
    if caps is not None and caps.sampling is not None:
        asks["sample_input"] = _sample("What is the capital of France?", 20)
    responses = ctx.input_responses or {}
    if asks and not set(asks) <= set(responses):
        return InputRequiredResult(input_requests=asks)
    return f"answered: {', '.join(sorted(asks)) or 'nothing to ask'}"


def register(server: MCPServer[Any]) -> None:
    """Add the input-required tools to ``server``, in this order."""
    for tool in (
        test_input_required_result_elicitation,
        test_input_required_result_sampling,
        test_input_required_result_list_roots,
        test_input_required_result_request_state,
        test_input_required_result_multiple_inputs,
        test_input_required_result_multi_round,
        test_input_required_result_tampered_state,
        test_input_required_result_capabilities,
    ):
        server.tool()(tool)
