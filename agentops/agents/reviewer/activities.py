"""The reviewer's one activity: read a diff with the engine's git, ask the model for findings."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypedDict

from agentops import git as engine_git
from agentops.kind import MODEL_CALL_LEASE, ActivityContext, InvalidInput, activity
from agentops.providers.answers import AnswerTool, ask_structured
from agentops.providers.scripted import offline_answer

DIFF_CHARS = 12_000  # of the diff the model reads (the rest is named as cut)
MAX_FINDINGS = 10
FINDING_CHARS = 300


@dataclass(frozen=True)
class ReviewInput:
    workspace: str
    base_sha: str
    head: str
    feature: str  # the feature's id
    description: str = ""
    steps: list[str] = field(default_factory=list)


class Review(TypedDict):
    feature: str
    head: str
    verdict: str  # "ok" or "concerns"
    findings: list[str]
    files: list[str]


REVIEW_TOOL = AnswerTool("give_review", "Your review of the diff against the feature's steps.", {
    "type": "object", "required": ["verdict", "findings"],
    "properties": {"verdict": {"type": "string", "enum": ["ok", "concerns"]},
                   "findings": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_FINDINGS}}})

REVIEW_SYSTEM = (
    "<task>reviewer_review</task>\nYou review one feature a coding session finished. Compare the diff with the "
    "feature's steps: name a step the diff does not seem to cover, a change outside the feature, code without a "
    "test. Findings are short and concrete (file and what); the next session reads them. Answer with give_review.")


def _validated(data: dict[str, Any]) -> dict[str, Any]:
    verdict, findings = data.get("verdict"), data.get("findings")
    if verdict not in ("ok", "concerns") or not isinstance(findings, list) or not all(
            isinstance(f, str) for f in findings):
        raise InvalidInput("give_review needs verdict ok or concerns and findings as a list of strings")
    return {"verdict": verdict, "findings": [f[:FINDING_CHARS] for f in findings[:MAX_FINDINGS]]}


def review_prompt(input: ReviewInput, files: list[str], diff: str) -> str:
    cut = f"\n(the diff is cut at {DIFF_CHARS} characters)" if len(diff) > DIFF_CHARS else ""
    return (f"<feature>{input.feature}</feature>\n<description>{input.description[:1000]}</description>\n"
            "<steps>\n" + "\n".join(f"- {s[:300]}" for s in input.steps[:30]) + "\n</steps>\n"
            f"<files>{', '.join(files[:100])}</files>\n<diff>\n{diff[:DIFF_CHARS]}{cut}\n</diff>")


@activity("reviewer_review", lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def reviewer_review(ctx: ActivityContext, input: ReviewInput) -> Review:
    """Review ``base_sha..head`` of the workspace against the feature's steps. The diff is read by
    the engine's git (its own configuration: nothing the workspace holds runs) and is data for the
    model, never instructions to this code."""
    if not re.fullmatch(r"[0-9a-f]{40}", input.base_sha) or not re.fullmatch(r"[0-9a-f]{40}", input.head):
        raise InvalidInput(f"reviewer_review needs two commit ids; got {input.base_sha[:50]!r}..{input.head[:50]!r}.")
    span = f"{input.base_sha}..{input.head}"
    files = [f for f in engine_git.run(input.workspace, "diff", "--no-ext-diff", "--no-textconv", "--name-only",
                                       span).splitlines() if f]
    diff = engine_git.run(input.workspace, "diff", "--no-ext-diff", "--no-textconv", "--no-color", span)
    answer, _ = ask_structured(ctx, system=REVIEW_SYSTEM, prompt=review_prompt(input, files, diff), tool=REVIEW_TOOL,
                               validate=_validated, max_tokens=800, what="review")
    return {"feature": input.feature, "head": input.head, "verdict": answer["verdict"],
            "findings": answer["findings"], "files": files[:100]}


@offline_answer("reviewer_review")
def offline_review(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The scripted provider's review: deterministic checks a reviewer would make first (the diff
    is empty; no test or check file changed; a step whose words the diff never mentions)."""
    text = str(messages[0]["content"]) if messages else ""
    changed = [f.strip() for f in _tag(text, "files").split(",") if f.strip()]
    diff = _tag(text, "diff").lower()
    steps = re.findall(r"^- (.+)$", _tag(text, "steps"), re.M)
    findings = []
    if not changed:
        findings.append("The diff changes no file: the feature passed on code that was already there.")
    elif not any("test" in f or f.startswith("checks/") for f in changed):
        findings.append(f"No test changed alongside {', '.join(changed[:5])}: add one for what the steps ask.")
    for step in steps:
        words = [w for w in re.findall(r"[a-z]{5,}", step.lower()) if w not in _COMMON]
        if words and not any(w in diff for w in words):
            findings.append(f"The diff does not mention {words[0]!r} of the step {step[:120]!r}.")
    return {"verdict": "concerns" if findings else "ok", "findings": findings[:MAX_FINDINGS]}


def _tag(text: str, name: str) -> str:
    found = re.search(rf"<{name}>(.*?)</{name}>", text, re.S)
    return found.group(1) if found else ""


_COMMON = {"should", "shows", "which", "there", "their", "after", "before", "every", "other", "these", "those",
           "where", "while", "about", "prints", "print", "check", "command", "returns", "python"}
