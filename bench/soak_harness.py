"""The soak's harness agents: a three-feature todo project on the scripted provider, and what is checked of them.

Each harness agent builds the first three features of the todo demo (``add``, ``list``, ``done``:
the demo's checks and ``todo.py.in``) from a schedule file the soak writes and every worker reads
(``AGENTOPS_HARNESS_SCHEDULE_FILE``). Its first ``done`` session is buggy (red), later ones fix it, so
every agent sees a red verdict; every attempt of every feature has an answer, so a session that
crashed for good (its activity out of attempts) only costs its feature an attempt. Plans:

- ``approve``: the feature list is approved (``max_attempts`` 3) → ``completed``;
- ``resume``: approved with ``max_attempts`` 1: F03's red first session blocks it and pauses the
  workflow for a person; the soak resumes it (a fresh attempt) → ``completed``;
- ``hold``: the same pause, left for a person: legitimately ``paused`` at DECIDE;
- ``propose``: approved; its F01 session also proposes a feature change (``propose_feature_change``:
  the demo's F04, ``rm``, with its check), which the soak approves as a second approval bound to
  the new contract hash; F04 is built as well → ``completed`` with four features;
- ``reject``: the feature list rejected → ``failed``; ``park``: its approval left open → ``waiting``.

The checks read the workflow's rows and its workspace (the harness's external effect is its git
history): no session's commit twice on the history of the head (one ``Harness-Operation`` trailer
per operation identity), the engine's count of sessions and of each feature's attempts equal to the
sessions that ran (one ``harness_session`` activity each), a completed agent with every feature
passing on the final verify in a fresh clone at the head it names, its workspace clean at that head.
Of a ``propose`` agent also: the contract it completed under is the proposal's, recomputed here
from the proposal's commit, approved by a wait bound to that hash, and unchanged at the final head.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

HARNESS_PLANS = ("approve", "resume", "propose", "reject", "park", "hold")  # the first ones first, when there are few
HARNESS_WEIGHTS = (5, 2, 2, 1, 1, 1)
FEATURES = ("F01", "F02", "F03")
# What a "propose" agent's F01 session proposes: the demo's next feature and its check.
PROPOSED = "F04"
PROPOSED_CHECK = "checks/check_f04_rm.py"
# The scripted provider plays the "propose" sessions for goals naming this variant (agentops/agents/harness/script.py).
PROPOSE_VARIANT = "propose"
# Sessions, check runs and the prepare step: the lease between heartbeats (the product's 45 s is for long sessions).
SESSION_LEASE_SECONDS = 10
# How long a person takes to resume a paused harness, seconds.
RESUME_AFTER_SECONDS = (0.0, 3.0)
# Attempts of a feature the schedule answers: more than any plan allows, so crashed sessions never run out of script.
SCRIPTED_ATTEMPTS = 8
# The harness launches in this first share of the launch window: its agents are the long ones.
LAUNCH_SHARE = 0.5


def goal(plan: Any) -> str:
    """The goal a harness agent is launched with; a "propose" one names its schedule's variant."""
    return f"Build the soak's todo CLI {plan.n}" + (f" [script: {PROPOSE_VARIANT}]" if plan.action == "propose" else "")


def features_of(action: str) -> tuple[str, ...]:
    """The features an agent of this plan completes with."""
    return (*FEATURES, PROPOSED) if action == "propose" else FEATURES


def plan_params(action: str) -> dict[str, str]:
    """Launch parameters: one attempt per feature where the plan is to see the budget pause."""
    return {"max_attempts": "1"} if action in ("resume", "hold") else {"max_attempts": "3"}


def write_schedule(path: Path) -> Path:
    """The scripted provider's sessions for the three-feature project (docs/harness.md, "The todo demo")."""
    demo = json.loads((_demo_dir() / "scaffold" / "features.json").read_text())
    features = [f for f in demo if f["id"] in FEATURES]
    proposed = [f for f in demo if f["id"] in (*FEATURES, PROPOSED)]
    checks = [f["check"].split(" ", 1)[1] for f in features]
    init = [{"tool": "write_file", "input": {"path": "features.json", "content": json.dumps(features, indent=2)}},
            *({"tool": "write_file", "path": p, "scaffold": p} for p in ("checks/_lib.py", *checks, "checks/smoke.sh",
                                                                         "init.sh", "progress.md", "todo.py")),
            {"tool": "git_commit", "input": {"message": "Scaffold: F01-F03, their checks, a stub that exits 1"}},
            {"tool": "end_session", "input": {"summary": "Wrote the feature list, three checks and a stub."}}]

    def solve(feature: str, tags: list[str]) -> list[dict[str, Any]]:
        return [{"tool": "write_file", "path": "todo.py", "render": tags},
                {"tool": "git_commit", "input": {"message": f"{feature}: implement"}},
                {"tool": "request_pass", "input": {"feature_id": feature}}]

    # A "propose" agent's F01 session proposes F04 before it asks for its pass; every attempt does, so
    # a retry of a session that died proposes again (only a session that ends is reviewed).
    propose = {"tool": "propose_feature_change", "input": {
        "features_json": json.dumps(proposed, indent=2), "reason": f"{PROPOSED} (rm) was left out of the list",
        "checks": {PROPOSED_CHECK: (_demo_dir() / "scaffold" / PROPOSED_CHECK).read_text()}}}
    sessions: dict[str, list[dict[str, Any]]] = {"INIT/1": init}
    for n in range(1, SCRIPTED_ATTEMPTS + 1):
        sessions[f"F01/{n}"] = solve("F01", ["F01"])
        *work, ask = solve("F01", ["F01"])
        sessions[f"{PROPOSE_VARIANT}:F01/{n}"] = [*work, propose, ask]
        sessions[f"F02/{n}"] = solve("F02", ["F01", "F02"])
        sessions[f"F03/{n}"] = solve("F03", ["F01", "F02", "F03", *(["F03BUG"] if n == 1 else [])])
        sessions[f"{PROPOSED}/{n}"] = solve(PROPOSED, ["F01", "F02", "F03", PROPOSED])
    path.write_text(json.dumps({"sessions": sessions}))
    return path


def _demo_dir() -> Path:
    # The package's path without importing it: the harness's modules need Django set up.
    return Path(__file__).resolve().parent.parent / "agentops" / "agents" / "harness" / "demo"


def allowed(action: str) -> set[str]:
    return {"approve": {"completed"}, "resume": {"completed"}, "propose": {"completed"}, "hold": {"paused"},
            "reject": {"failed"}, "park": {"waiting"}}[action]


def at_rest(plan: Any, wf: Any, open_approval: bool) -> bool:
    """Waiting legitimately, as the plan meant: its approval left open, or paused for a person at DECIDE."""
    if plan.action == "park":
        return wf.status == "waiting" and open_approval
    if plan.action == "hold":
        return wf.status == "paused" and wf.pause_cause == "definition" and wf.current_node == "DECIDE"
    return False


def check(plan: Any, wf: Any, v: list[str], tally: Counter[str]) -> None:
    """What must hold of one harness agent once it converged (violations appended to ``v``)."""
    from workflows.models import Activity, Event

    state = wf.state or {}
    label = f"harness workflow {wf.pk} ({plan.action})"
    sessions = list(Activity.objects.filter(workflow_id=wf.pk, name="harness_session").values_list("input", "status"))
    ended = Counter((e["feature"], e["feature_attempt"]) for e in Event.objects.filter(
        workflow_id=wf.pk, kind="harness.session_ended").values_list("data", flat=True))
    tally["sessions"] += len(sessions)
    tally["crashed_attempts"] += sum(Event.objects.filter(
        workflow_id=wf.pk, kind="harness.session_ended", data__crashed_attempts__gt=0).values_list(
        "data__crashed_attempts", flat=True))
    tally["check_runs"] += Event.objects.filter(workflow_id=wf.pk, kind="harness.check_ran").count()
    tally["wip_saved"] += Event.objects.filter(workflow_id=wf.pk, kind="harness.wip_saved").count()
    tally["leases_expired"] += Event.objects.filter(workflow_id=wf.pk, kind="activity.lease_expired").count()
    tally["proposals"] += len(state.get("proposals") or [])
    if wf.status in ("failed", "waiting") and not state.get("sessions"):
        return  # rejected or parked at the feature list: no session ran
    # The engine counted each session once, over every visit: one activity each, one count each.
    if state.get("sessions", 0) != len(sessions):
        v.append(f"{label}: the engine counted {state.get('sessions')} sessions, {len(sessions)} ran")
    # Each feature's attempts count from the latest visit of INITIALIZE (a release change revalidates
    # there and the scaffold, its feature list included, is built again).
    inits = list(Activity.objects.filter(workflow_id=wf.pk, name="harness_initialize").values_list("pk", flat=True))
    tally["initialized_again"] += max(0, len(inits) - 1)
    current = list(Activity.objects.filter(workflow_id=wf.pk, name="harness_session",
                                           pk__gt=max(inits, default=0)).values_list("input", flat=True))
    per_feature = Counter(str((i.get("feature") or {}).get("id", "REPAIR")) for i in current)
    for feature in state.get("features", []):
        if feature.get("attempts", 0) != per_feature.get(feature["id"], 0):
            v.append(f"{label}: feature {feature['id']} counts {feature.get('attempts')} attempts, "
                     f"{per_feature.get(feature['id'], 0)} sessions ran on it")
    ran = {(str((i.get("feature") or {}).get("id", "REPAIR")), int(i.get("attempt", 0))) for i, s in sessions
           if s == "succeeded"}
    if missing := sorted(ran - set(ended)):
        v.append(f"{label}: sessions {missing} succeeded without a harness.session_ended event")
    # The workspace's history: no session's commit twice.
    root = Path(str(state.get("workspace", "")))
    head = str(state.get("head", ""))
    if not (root / ".git").exists() or not head:
        v.append(f"{label}: no workspace at {root!s} or no head ({head!r})")
        return
    trailers = _git(root, "log", "--format=%(trailers:key=Harness-Operation,valueonly,separator=%x2C)", head).split()
    tally["commits"] += len(trailers)
    if twice := sorted(k for k, n in Counter(trailers).items() if n > 1):
        tally["duplicate_commits"] += len(twice)
        v.append(f"{label}: operations committed more than once on the history of {head[:12]}: {twice[:5]}")
    if wf.status != "completed":
        return
    result = wf.result or {}
    expected = features_of(plan.action)
    if result.get("features_passing") != len(expected) or result.get("head") != head \
            or [f["id"] for f in state.get("features", [])] != list(expected):
        v.append(f"{label}: completed with {result.get('features_passing')} of {len(expected)} features "
                 f"({[f['id'] for f in state.get('features', [])]}) passing at {str(result.get('head'))[:12]} "
                 f"(state head {head[:12]})")
    not_verified = [f["id"] for f in state.get("features", [])
                    if f.get("status") != "passing" or (f.get("evidence") or {}).get("where") != "clone"
                    or (f.get("evidence") or {}).get("commit") != head]
    if not_verified:
        v.append(f"{label}: completed, but features {not_verified} were not passed by the final verify at the head")
    at_head, dirty = _git(root, "rev-parse", "HEAD").strip(), _git(root, "status", "--porcelain").strip()
    if at_head != head or dirty:
        v.append(f"{label}: its workspace is at {at_head[:12]} (result {head[:12]}) with changes {dirty[:200]!r}")
    if plan.action == "propose":
        _check_proposal(wf, root, head, label, v, tally)


def _check_proposal(wf: Any, root: Path, head: str, label: str, v: list[str], tally: Counter[str]) -> None:
    """A completed "propose" agent worked to the contract a person approved: the proposal's.

    The contract hash is recomputed here from the proposal's commit (features.json and checks/ by
    blob id, as ``agentops.agents.harness.checks.contract_hash`` defines it); it must be the hash the
    workflow completed under, the one its second approval was bound to (the first was bound to the
    scaffold's; both of the latest visit of INITIALIZE), and the contract at the final head: the
    sessions after the adoption left it alone.
    """
    from workflows.models import Wait

    state = wf.state or {}
    approved = [p for p in state.get("proposals") or [] if str(p.get("outcome", "")).startswith("approved")]
    if len(approved) != 1:
        v.append(f"{label}: completed with {len(approved)} approved proposals, not 1: {state.get('proposals')}")
        return
    proposal = approved[0]
    tally["proposals_approved"] += 1
    commit = str(proposal.get("commit", ""))
    recomputed = _contract_hash(root, commit)
    approved_waits = list(Wait.objects.filter(workflow_id=wf.pk, kind=Wait.Kind.APPROVAL,
                                              decision=Wait.Decision.APPROVED).order_by("pk").values_list(
        "node", "candidate_hash"))
    # From the latest approval of the feature list on: a release change revalidates at INITIALIZE,
    # and the feature list and the proposal are approved again on the new visit.
    lists = [i for i, (node, _) in enumerate(approved_waits) if node == "WAIT_FOR_APPROVAL"]
    waits = [candidate for _, candidate in approved_waits[lists[-1] if lists else 0:]]
    if not recomputed == proposal.get("contract_hash") == state.get("contract_hash"):
        v.append(f"{label}: the proposal's commit {commit[:12]} has contract {recomputed[:12]}; the workflow "
                 f"recorded {str(proposal.get('contract_hash'))[:12]} and completed under "
                 f"{str(state.get('contract_hash'))[:12]}")
    if len(waits) != 2 or waits[1] != recomputed or waits[0] == recomputed:
        v.append(f"{label}: approvals bound to {[w[:12] for w in waits]}; expected the feature list's, then "
                 f"the proposal's {recomputed[:12]}")
    if _git(root, "rev-parse", f"refs/heads/{proposal.get('ref')}").strip() != commit:
        v.append(f"{label}: {proposal.get('ref')} does not point at the proposal's commit {commit[:12]}")
    listed = [f["id"] for f in json.loads(_git(root, "show", f"{commit}:features.json"))]
    if listed != list(features_of("propose")) or _contract_hash(root, head) != recomputed:
        v.append(f"{label}: the proposal lists {listed}; the contract at the head {head[:12]} is "
                 f"{_contract_hash(root, head)[:12]}, the approved one {recomputed[:12]}")


def _contract_hash(root: Path, commit: str) -> str:
    listing = _git(root, "ls-tree", "-r", commit, "--", "features.json", "checks").rstrip()  # as gitops.git returns it
    return hashlib.sha256(listing.encode()).hexdigest()


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-C", str(root), *args], capture_output=True,
                          text=True, timeout=30, check=False, env={"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root),
                                                                  "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {root} failed: {done.stderr.strip()[:300]}")
    return done.stdout
