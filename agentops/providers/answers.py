"""Structured answers from a model: a forced tool call with a JSON schema, validated, with bounded feedback.

Plans, verdicts and proposals are data the workflow acts on. They are asked for as the input of
one tool the model must call (``tool_choice``), whose schema says what a good answer is. What
comes back is still checked by the activity's validator (model output is data); an answer that
does not pass, or that was cut off by ``max_tokens``, is sent back to the model with the reason,
at most ``FEEDBACK_TURNS`` times, before the attempt gives up with a ``Retryable`` error. A
provider that answers in text instead (a gateway that drops ``tool_choice``, or Claude writing
JSON in a fenced block) is accepted too: the JSON object is taken out of the text.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from workflows.errors import InvalidInput, Retryable
from workflows.provider import ModelResponse

if TYPE_CHECKING:
    from workflows.activity_context import ActivityContext

T = TypeVar("T")

FEEDBACK_TURNS = 2
FENCED = re.compile(r"```(?:json|JSON)?\s*\n(?P<body>.*?)\n?```", re.DOTALL)


@dataclass(frozen=True)
class AnswerTool:
    """The tool a structured answer is given through: its name, what it is for, its JSON schema."""

    name: str
    description: str
    schema: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.schema}


def ask_structured(
    ctx: ActivityContext, *, system: str, prompt: str, tool: AnswerTool, validate: Callable[[dict[str, Any]], T],
    max_tokens: int, what: str, steer: bool = False,
) -> tuple[T, list[ModelResponse]]:
    """Ask for one structured answer and return it validated, with every response it took.

    Model calls are ledger calls 0, 1, 2 … of the activity (``metered_complete``). Each rejected
    answer is recorded as a ``model.answer_rejected`` event with the reason the model was given.
    Raises ``Retryable`` when the last allowed answer is still unusable: a model's next try at
    the same question usually succeeds, so the activity's retry policy gets another attempt.
    With ``steer``, each call first takes the workflow's steer messages as a user turn
    (``agentops.steering.steered``).
    """
    from agentops.steering import steered
    from workflows.metering import metered_complete

    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    responses: list[ModelResponse] = []
    problem = ""
    for call in range(FEEDBACK_TURNS + 1):
        if steer:
            messages = steered(ctx, call=call, messages=messages)
        response = metered_complete(ctx, call=call, system=system, messages=messages, max_tokens=max_tokens,
                                    tools=[tool.definition()], tool_choice={"type": "tool", "name": tool.name})
        responses.append(response)
        try:
            return validate(answer_data(response, tool=tool.name, max_tokens=max_tokens, what=what)), responses
        except InvalidInput as exc:
            problem = str(exc)
        ctx.note("model.answer_rejected", call=call, what=what, reason=problem[:500])
        messages = [*messages, *feedback(response, tool=tool.name, problem=problem)]
    raise Retryable(f"The model's {what} was still unusable after {FEEDBACK_TURNS + 1} answers with the reason fed "
                    f"back ({problem}); the activity will ask again on its next attempt.")


def answer_data(response: ModelResponse, *, tool: str, max_tokens: int, what: str) -> dict[str, Any]:
    """The JSON object of an answer: the forced tool's input, else the JSON in its text.

    Raises InvalidInput when the answer was cut off or holds no JSON object."""
    if response.stop_reason == "max_tokens":
        raise InvalidInput(f"The model's {what} was cut off at the output limit (max_tokens={max_tokens}) before it "
                           "was complete; answer again, more briefly.")
    for call in response.tool_calls:
        if call["name"] == tool and isinstance(call.get("input"), dict):
            return dict(call["input"])
    return json_object_in(response.text, what=what)


def json_object_in(text: str, *, what: str) -> dict[str, Any]:
    """The JSON object in ``text``: all of it, a fenced ```json block, or from the first ``{`` to the last ``}``."""
    stripped = text.strip()
    candidates = [stripped, *(m.group("body") for m in FENCED.finditer(text))]
    if "{" in stripped:
        candidates.append(stripped[stripped.index("{"):stripped.rindex("}") + 1])
    error = "no JSON object found"
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError as exc:
            error = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            continue
        if isinstance(data, dict):
            return data
        error = f"a JSON {type(data).__name__}, not an object"
    raise InvalidInput(f"The model's {what} is not a JSON object ({error}); it was not used.")


def feedback(response: ModelResponse, *, tool: str, problem: str) -> list[dict[str, Any]]:
    """The turns that tell the model why its answer was not used and ask for another.

    A tool call is answered with an error ``tool_result`` for each of its tool_use blocks (the
    API requires one); a text answer with a user message."""
    turns: list[dict[str, Any]] = []
    assistant = response.assistant_turn()
    if assistant["content"]:
        turns.append(assistant)
    ask = f"That answer could not be used: {problem} Call {tool} again with a corrected, complete answer."
    tool_ids = [block["id"] for block in assistant["content"] if block.get("type") == "tool_use"]
    if tool_ids:
        turns.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "content": ask, "is_error": True} for tool_id in tool_ids]})
    else:
        turns.append({"role": "user", "content": ask})
    return turns
