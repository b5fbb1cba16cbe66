"""The fake Messages API of the agents-in-flight benchmark, in a process of its own (``python -m bench.fake_api``).

It plays Claude for the ``autonomous`` kind (``tests/fakes/claude_agent.py``) and answers every
call after ``--latency`` seconds. Its own process, as the API is on another machine: its request
handling does not compete with the orchestrator's launches for one interpreter. It prints its URL,
then obeys lines on stdin, answering each with one JSON line:

- ``play LATENCY TOOL_TURNS``: answer from now on with this latency and this many tool calls per task;
- ``answer LATENCY``: answer every call with a short text after this latency (the rate-limits benchmark);
- ``limit RPM ITPM OTPM [BUCKET_S]``: enforce an organisation limit like the API's from now on (token
  buckets of requests, input and output tokens per minute, holding BUCKET_S seconds of their rate,
  60 by default, full at first; 429 with ``retry-after`` past them; ``anthropic-ratelimit-*``
  headers on every answer); 0 for a dimension without a limit, ``limit off``;
- ``other SHARE SECONDS``: another client of the organisation takes SHARE of the limit's requests
  and input tokens for SECONDS from now (requests of a minute's tokens over its requests, sent
  at an even rate straight into the buckets; a refused one is not sent again);
- ``reset``: forget the requests so far and restart the peak of calls in flight;
- ``report``: every request so far (when it came, when its answer left, its usage key, its status,
  the input tokens it was counted for), the peak of calls in flight, when the limit's buckets
  first fell below a tenth, and requests nothing was scripted for.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI, OrganisationLimit
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, first_text, structured, task_of, tool_results


class LatencyAPI(FakeAnthropicAPI):
    """The fake API, counting the calls it holds (in flight) and noting when each answer leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.answered_at: dict[str, float] = {}  # request id -> when its answer left
        self._count_lock = threading.Lock()

    def took(self) -> None:
        with self._count_lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def message_for(self, body: dict[str, Any], answer: Answer, request_id: str) -> dict[str, Any]:
        message = super().message_for(body, answer, request_id)  # after the latency, right before sending
        with self._count_lock:
            self.in_flight -= 1
            self.answered_at[request_id] = time.time()
        return message

    def reset(self) -> None:
        with self._count_lock:
            self.peak_in_flight = self.in_flight
            self.requests.clear()
            self.answered_at.clear()
            if self.limit is not None:
                self.limit.low_since = None

    def report(self) -> dict[str, Any]:
        with self._count_lock:
            calls = [{"key": r.headers.get("x-agentops-usage-key", ""), "at": r.at,
                      "answered_at": self.answered_at.get(r.request_id), "status": r.status,
                      "input_tokens": (r.usage or {}).get("input_tokens", 0)
                      + (r.usage or {}).get("cache_creation_input_tokens", 0)} for r in self.requests]
            low_since = self.limit.low_since if self.limit is not None else None
            return {"calls": calls, "peak_in_flight": self.peak_in_flight, "unexpected": self.unexpected[:3],
                    "limit_low_since": low_since}


class BenchClaude(ClaudeForAutonomous):
    """One task; the task takes ``tool_turns`` tool calls (write a note, then read it back), then
    reports; every answer after ``latency`` seconds. Calls per agent: plan, tool_turns + 1, verify."""

    def __init__(self, api: LatencyAPI, *, latency: float, tool_turns: int) -> None:
        super().__init__()
        self.api, self.latency, self.tool_turns = api, latency, tool_turns

    def __call__(self, body: dict[str, Any]) -> Answer:
        self.api.took()
        if task_of(body) in ("plan_tasks", "replan"):
            answer = structured(body, {"tasks": TASKS[:1]}, preamble="Here is the plan:")
        else:
            answer = super().__call__(body)
        answer.delay_seconds = self.latency
        return answer

    def work(self, body: dict[str, Any]) -> Answer:
        step = tool_results(body)
        if step >= self.tool_turns:
            return fake.text("Wrote notes/task.md with what a newcomer needs and checked it.")
        if step == 0:
            return fake.tool_use("write_file", {"path": "notes/task.md", "content": first_text(body)[:400]},
                                 say="Writing the note.")
        return fake.tool_use("read_file", {"path": "notes/task.md"}, say="Checking what I wrote.")


def other_client(limit: OrganisationLimit, *, share: float, seconds: float) -> None:
    """Take ``share`` of the limit's requests (and of its input tokens) for ``seconds``, evenly."""
    rpm, itpm = limit.limits["requests"], limit.limits["input-tokens"]
    per_second = share * rpm / 60
    tokens = itpm // rpm if rpm else 0
    start = time.time()
    sent = 0
    while time.time() - start < seconds:
        due = start + sent / per_second
        time.sleep(max(0.0, due - time.time()))
        limit.take(input_tokens=tokens, max_tokens=0)
        sent += 1


class ShortAnswers:
    """Every call answered with a short text after ``latency`` seconds."""

    def __init__(self, api: LatencyAPI, *, latency: float) -> None:
        self.api, self.latency = api, latency

    def __call__(self, body: dict[str, Any]) -> Answer:
        self.api.took()
        return fake.text("Done.", delay_seconds=self.latency)


def main() -> int:
    api = LatencyAPI().start()
    print(json.dumps({"url": api.url}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "play":
            api.responder = BenchClaude(api, latency=float(args[0]), tool_turns=int(args[1]))
            answer: dict[str, Any] = {"ok": True}
        elif command == "answer":
            api.responder = ShortAnswers(api, latency=float(args[0]))
            answer = {"ok": True}
        elif command == "limit":
            api.limit = None if args == ["off"] else OrganisationLimit(
                requests_per_minute=int(args[0]), input_tokens_per_minute=int(args[1]),
                output_tokens_per_minute=int(args[2]), bucket_seconds=float(args[3]) if len(args) > 3 else 60.0)
            answer = {"ok": True}
        elif command == "other":
            if api.limit is None:
                answer = {"error": "no limit to share"}
            else:
                threading.Thread(target=other_client, args=(api.limit,), daemon=True,
                                 kwargs={"share": float(args[0]), "seconds": float(args[1])}).start()
                answer = {"ok": True, "at": time.time()}
        elif command == "reset":
            api.reset()
            answer = {"ok": True}
        elif command == "report":
            answer = api.report()
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)
    api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
