"""``python -m bench.soak``: many agents on real workers under a randomized nemesis, checked from outside.

The soak creates its own PostgreSQL database and starts its own Redis server (on a port of its
own: restarting it disturbs nobody), a deploy target, workers and a beat (the test kit's
cluster, ``workflows/testing/cluster.py``). It launches release, autonomous and harness agents
(a three-feature todo project each on the scripted provider, ``bench/soak_harness.py``) over
``--seconds`` and, all that time, injects faults drawn from ``--seed``:
SIGKILL and SIGSTOP/SIGCONT of workers, beat killed and restarted, a second beat for a while,
the broker shut down without saving and restarted, the broker flushed, ``pg_terminate_backend``
of every other connection to the database, workers restarted with their wall clock minutes
off (libfaketime, where installed), the deploy target making a deployment but dropping the
connection before it answers, a worker whose pool process dies right after the deploy
target accepted its deploy, and partitions: every worker and beat reaches PostgreSQL and Redis
through forwarders of its own in the soak's process (``workflows/testing/forwarder.py``), and the
nemesis cuts one of them off from either or both for a few seconds. Approvals, rejections,
cancels, new goals and the resumption of a harness paused for a person are given by the soak
through the public services, as people would. Then it heals (heals the partitions, resumes what
is paused, restarts what was killed, stops the second beat, brings the broker back), waits for
every workflow to converge and checks, from the deploy target's state file, the harness agents'
workspaces and the database rows:

- every workflow is terminal, or waiting where the soak deliberately left it (an open approval, a
  harness paused for a person), and ended as its plan allows (an approved release completed, a
  rejected one failed, …);
- of each harness agent: no operation's commit twice in its workspace's history, each session
  counted once by the engine (sessions and each feature's attempts equal to the sessions that
  ran), and a completed one passed by its final verify at the head it names, its tree clean;
- the deploy target saw at most one create and one delete per operation identity; a completed
  release owns exactly one live deployment and every other workflow none; no effect belongs to
  no workflow;
- every model call recorded in a history has a charged ledger row, and no ledger row is still
  reserved;
- every workflow's event sequence is 1, 2, 3, … without a gap; no work is left running.

It prints its figures and exits 1 on any violation, naming the seed (replay with ``--seed``:
the same seed gives the same plans and the same fault schedule; which process a fault hits
depends on what is alive at that moment). See bench/README.md, "Soak".
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import soak_harness, soak_tree
from bench.infra import REPO_ROOT, Postgres
from workflows.testing import faketime
from workflows.testing.cluster import SHORT_CLOCKS, Cluster, Proc, RedisServer, free_port, wait_for
from workflows.testing.forwarder import Forwarder

FAULT_KINDS = ("worker_kill", "worker_pause", "beat_restart", "second_beat", "broker_restart", "broker_flush",
               "pg_terminate", "clock_skew", "target_drop", "kill_after_accept", "partition", "release_change")
# A worker armed with these rules dies (its pool process, SIGKILL) right after the deploy target
# accepted its next first deploy attempt, before the result is recorded: the ambiguous window; or
# in the middle of a harness session on F02 (after its write_file, before its commit), as
# make demo-harness does: the next attempt saves the half-work to a wip/ ref and starts over.
KILL_AFTER_ACCEPT = [{"point": "activity.after_external_call", "when": {"activity": "deploy", "attempt": 1},
                      "action": "sigkill_self"},
                     {"point": "harness.after_tool", "when": {"tool": "write_file", "feature": "F02", "attempt": 1},
                      "action": "sigkill_self"}]
RELEASE_PLANS = ("approve", "reject", "cancel", "supersede", "park")
RELEASE_WEIGHTS = (6, 1, 1, 1, 1)
TICK_SECONDS = 0.2
# How long a person's request waits for a workflow's row lock before the driver tries again next tick.
DRIVER_LOCK_TIMEOUT_MS = 2000
LOCK_NOT_AVAILABLE = "55P03"
MAX_DEFERRALS = 10
# When a "cancel" or "supersede" plan changes its mind: with this chance while the approval is still
# open, else this many seconds after the approval (a deploy follows an approval within about a second).
CHANGE_BEFORE_APPROVAL = 0.4
CHANGE_OF_MIND_SECONDS = (0.0, 1.0)
# The candidates' test command takes this long, so that faults find work in flight.
TEST_SCRIPT = "import random, time\ntime.sleep(random.uniform(0.5, 3.0))\nprint('tests pass')\n"
MODEL_CALL_LEASE_SECONDS = 8
SKEW_SECONDS = (60, 300)
PAUSE_SECONDS = (1.5, 9.0)  # some shorter, some longer than the 4 s lease: zombies get fenced
RESTART_AFTER_SECONDS = (0.5, 3.0)
SECOND_BEAT_SECONDS = (6.0, 15.0)
# A partition lasts this long: some cuts outlast the 4 s lease (the cut-off worker's late writes are
# fenced), some the 10 s socket timeout of a broker connection (the worker gives up on it and reconnects).
PARTITION_SECONDS = (2.0, 12.0)
PARTITION_CUTS = (("db",), ("broker",), ("db", "broker"))
# The beat and the second beat: like each worker, each reaches the services through forwarders of its own.
BEATS = ("beat", "beat2")
# The I/O workers: the default AGENTOPS_IO_QUEUE (the soak's processes get no AGENTOPS_ settings
# of their own), threads and database connections each.
IO_QUEUE = "agentops.io"
IO_THREADS = 50
IO_DB_POOL_SIZE = 4
# The shipped kinds (agentops/settings.py's default) and the tree kinds: on the workers, and here (the
# soak launches them).
AGENT_MODULES = ("agentops.agents.release,agentops.agents.autonomous,agentops.agents.harness,agentops.agents.reviewer,"
                 "bench.soak_tree_kinds")
APPROVER, REQUESTER = "soak-approver", "soak-requester"
APPROVER_GROUP = "release-approvers"
HARNESS_APPROVER_GROUP = "harness-approvers"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0, help="how long the nemesis runs (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="seed of plans and faults (default: from the clock)")
    parser.add_argument("--release", type=int, default=None,
                        help="release agents to launch (default: one per 5 s of --seconds, at least 10)")
    parser.add_argument("--autonomous", type=int, default=None,
                        help="autonomous agents to launch (default: one per 20 s of --seconds, at least 3)")
    parser.add_argument("--harness", type=int, default=None,
                        help="harness agents to launch, a three-feature todo project each "
                             "(default: one per 20 s of --seconds, at least 3)")
    parser.add_argument("--trees", type=int, default=None,
                        help="trees to launch, a root with two children that deploy each (bench/soak_tree.py; "
                             "default: one per 10 s of --seconds, at least 4)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default %(default)s)")
    parser.add_argument("--io-workers", type=int, default=1,
                        help="of those, how many are threads workers on the I/O queue, as the README runs model-heavy "
                             "agents; the others are prefork workers on every queue (default %(default)s)")
    parser.add_argument("--fault-gap", type=float, nargs=2, default=(3.0, 8.0), metavar=("MIN", "MAX"),
                        help="seconds between two faults, drawn uniformly (default 3 8)")
    parser.add_argument("--launch-share", type=float, default=1.0,
                        help="launches are spread over this share of --seconds (default %(default)s)")
    parser.add_argument("--converge-timeout", type=float, default=300.0,
                        help="seconds allowed after healing for every workflow to converge (default %(default)s)")
    parser.add_argument("--postgres-url", default=os.environ.get("SOAK_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432"),
                        help="server to create the soak database on (default: %(default)s)")
    parser.add_argument("--database", default=f"agentops_soak_{os.getpid()}", help="database created and dropped")
    parser.add_argument("--redis-port", type=int, default=0,
                        help="port of the Redis server the soak starts (default: a free port)")
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "var" / "soak",
                        help="logs, the deploy target's state, the Redis dir (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here too")
    parser.add_argument("--keep-db", action="store_true", help="keep the soak database afterwards")
    args = parser.parse_args(argv)
    if not 0 <= args.io_workers < args.workers:
        parser.error(f"--io-workers must be 0 or more and leave at least one prefork worker of --workers "
                     f"{args.workers} for the default queue; got {args.io_workers}")
    return args


def _out_of_attempts_to_faults(wf: Any) -> bool:
    """Whether ``wf`` failed because one of its activities used all its attempts, each one lost (its
    worker killed or cut off by the nemesis) or failed, and its definition said so in its own words
    (the harness: "The initializer session failed: attempt 3 lost: ..."): the reason quotes the
    activity's last error."""
    from workflows.models import Activity

    spent = Activity.objects.filter(workflow_id=wf.pk, status="failed").exclude(error="")
    return any(a.attempt >= a.max_attempts and a.error in (wf.reason or "")
               for a in spent.only("attempt", "max_attempts", "error"))


# --- The plan: drawn from the seed before anything runs ---

@dataclass
class Plan:
    """One agent the soak launches, and what the soak will do with it."""

    n: int
    kind: str  # release, autonomous, harness or tree
    action: str  # release: one of RELEASE_PLANS; autonomous: run; harness: one of soak_harness.HARNESS_PLANS;
    # tree: one of soak_tree.TREE_PLANS
    launch_at: float
    change_before_approval: bool = False  # cancel/supersede: while the first approval is open
    change_after: float = 0.0  # cancel/supersede: else seconds after the first approval
    approve_twice: bool = False  # deliver the approval twice (the second must change nothing)
    workflow_id: int | None = None
    approvals: int = 0
    approved_at: float | None = None
    changed: str = ""  # what the change of mind did: cancelled, cancel_refused, superseded, …
    resume_after: float = 0.0  # harness "resume": seconds a person takes to resume the pause
    paused_seen: float | None = None
    resumed: int = 0
    params: dict[str, Any] = field(default_factory=dict)  # tree: its launch parameters
    changed_after_child: bool = False  # tree: the change of mind came right after a child completed


@dataclass
class FaultEvent:
    at: float
    kind: str
    deferred: int = 0


def draw_plans(rng: random.Random, *, releases: int, autonomous: int, harness: int = 0, trees: int = 0,
               launch_window: float) -> list[Plan]:
    def actions(choices: tuple[str, ...], weights: tuple[int, ...], k: int) -> list[str]:
        drawn = list(choices[:min(k, len(choices))])  # every plan at least once (the first ones when few)
        drawn += rng.choices(choices, weights=weights, k=k - len(drawn))
        rng.shuffle(drawn)
        return drawn

    plans = [("release", a) for a in actions(RELEASE_PLANS, RELEASE_WEIGHTS, releases)]
    plans += [("autonomous", "run")] * autonomous
    plans += [("harness", a) for a in actions(soak_harness.HARNESS_PLANS, soak_harness.HARNESS_WEIGHTS, harness)]
    plans += [("tree", a) for a in actions(soak_tree.TREE_PLANS, soak_tree.TREE_WEIGHTS, trees)]
    rng.shuffle(plans)
    # The harness agents are the long ones (a scaffold, a validation, four sessions and their checks, a
    # final verify): launched in the first part of the window, they live through faults and converge in time.
    times = [rng.uniform(0, launch_window * (soak_harness.LAUNCH_SHARE if kind == "harness" else 1.0))
             for kind, _ in plans]
    drawn = sorted(zip(times, plans, strict=True))
    out = [Plan(n=i, kind=kind, action=action, launch_at=at,
                change_before_approval=rng.random() < CHANGE_BEFORE_APPROVAL,
                change_after=rng.uniform(*CHANGE_OF_MIND_SECONDS), approve_twice=rng.random() < 0.25,
                resume_after=rng.uniform(*soak_harness.RESUME_AFTER_SECONDS))
           for i, (at, (kind, action)) in enumerate(drawn)]
    for plan in out:
        if plan.kind == "tree":
            plan.change_after = rng.uniform(*soak_tree.CHANGE_AFTER_SECONDS)
            plan.params = soak_tree.launch_params(rng)
    return out


def draw_faults(rng: random.Random, *, seconds: float, gap: tuple[float, float],
                kinds: tuple[str, ...]) -> list[FaultEvent]:
    """Faults every ``gap`` seconds; kinds in shuffled rounds, so each kind comes up as often as the others."""
    faults: list[FaultEvent] = []
    at = rng.uniform(*gap) / 2
    round_: list[str] = []
    while at < seconds:
        if not round_:
            round_ = list(kinds)
            rng.shuffle(round_)
        faults.append(FaultEvent(at=at, kind=round_.pop()))
        at += rng.uniform(*gap)
    return faults


class DeployTarget:
    """The deploy target as a process of its own (``python -m agentops.deploytarget.server``): its state
    file, written before it answers, is what the soak checks the effects against."""

    def __init__(self, port: int, state_path: Path, log_path: Path) -> None:
        self.port, self.state_path, self.log_path = port, state_path, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "agentops.deploytarget.server", "--port", str(self.port),
                 "--state", str(self.state_path)], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(answers, timeout=30, what=f"the deploy target on port {self.port}")

    def set_fault(self, fault: dict[str, Any]) -> None:
        """POST /_faults (docs/deploy-protocol.md): {"mode": "accept_then_drop", "count": 2}, {"mode": "none"}."""
        request = urllib.request.Request(f"{self.url}/_faults", data=json.dumps(fault).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


# --- The soak ---

@dataclass
class Figures:
    seed: int
    seconds: float
    workflows: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    faults_skipped: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    lost: int = 0
    stuck: int = 0
    converge_s: float | None = None
    ledger: dict[str, int] = field(default_factory=dict)
    harness: dict[str, int] = field(default_factory=dict)  # sessions, check runs, commits, … of the harness agents
    trees: dict[str, Any] = field(default_factory=dict)  # the trees' outcomes, effects and spend (bench/soak_tree.py)
    partitions: dict[str, int] = field(default_factory=dict)  # cuts by what was cut, and what they caught
    recovery: dict[str, int] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    unexpected_exits: list[str] = field(default_factory=list)
    failures_seen: list[str] = field(default_factory=list)  # sweep rows and handlers that raised (recorded, retried)
    violations: list[str] = field(default_factory=list)
    wall_s: float = 0.0


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed if args.seed is not None else int(time.time() * 1000) % 2**31
        self.rng = random.Random(self.seed)
        seconds = args.seconds
        releases = args.release if args.release is not None else max(10, int(seconds / 5))
        autonomous = args.autonomous if args.autonomous is not None else max(3, int(seconds / 20))
        harness = args.harness if args.harness is not None else max(3, int(seconds / 20))
        trees = args.trees if args.trees is not None else max(4, int(seconds / 10))
        self.kinds = FAULT_KINDS if faketime.faketime_available() else tuple(k for k in FAULT_KINDS
                                                                                if k != "clock_skew")
        self.plans = draw_plans(self.rng, releases=releases, autonomous=autonomous, harness=harness, trees=trees,
                                launch_window=seconds * args.launch_share)
        self.schedule = draw_faults(self.rng, seconds=seconds, gap=tuple(args.fault_gap), kinds=self.kinds)
        self.figures = Figures(seed=self.seed, seconds=seconds)
        self.faults: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.run_dir: Path = args.run_dir / f"seed-{self.seed}"
        self.later: list[tuple[float, str, Callable[[], None]]] = []  # undo actions: (at, what, do)
        self.paused: set[str] = set()
        self.killed: set[int] = set()  # pids the nemesis ended on purpose
        self.skews: dict[str, int] = {}
        self.armed: set[str] = set()  # workers started with KILL_AFTER_ACCEPT
        self.pg_terminated = 0
        self.prompt_version = ""  # after a release change: the prompt version every worker starts with
        self.links: dict[str, dict[str, Forwarder]] = {}  # process name → service → its forwarder
        self.partitions: Counter[str] = Counter()
        self.t0 = 0.0

    def log(self, message: str) -> None:
        t = time.monotonic() - self.t0 if self.t0 else 0.0
        print(f"[soak {t:7.1f}s] {message}", flush=True)

    # --- set-up and tear-down ---

    def setup(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pg = Postgres(self.args.postgres_url)
        if not self.pg.ping():
            raise SystemExit(f"PostgreSQL at {self.args.postgres_url} does not answer")
        self.database_url = self.pg.recreate(self.args.database)
        self.redis = RedisServer(self.args.redis_port or free_port(), self.run_dir)
        self.redis.start()
        self._migrate()
        self.links = {name: self._links() for name in (*(f"w{i + 1}" for i in range(self.args.workers)), *BEATS)}
        self.deploy_state = self.run_dir / "deploy-target.json"
        self.deploy_state.unlink(missing_ok=True)
        self.target = DeployTarget(free_port(), self.deploy_state, self.run_dir / "deploy-target.log")
        self.target.start()
        self.harness_schedule = soak_harness.write_schedule(self.run_dir / "harness-schedule.json")
        # A run before with this seed left its harness agents' workspaces, under the same workflow ids.
        shutil.rmtree(self.run_dir / "workspaces", ignore_errors=True)
        (self.run_dir / "faults.log").unlink(missing_ok=True)  # and its fired faults, which the figures count
        self._setup_django()
        self.cluster = Cluster(
            run_dir=self.run_dir, database_url=self.database_url, broker_url=self.redis.url, cwd=REPO_ROOT,
            clocks={**SHORT_CLOCKS, "AGENTOPS_MODEL_CALL_LEASE_SECONDS": str(MODEL_CALL_LEASE_SECONDS)},
            drop_env_prefixes=("AGENTOPS_", "ANTHROPIC_", "SOAK_"),
            extra_env={"AGENTOPS_DEPLOY_TARGET_URL": self.target.url, "AGENTOPS_MODEL_PROVIDER": "scripted",
                       "AGENTOPS_HARNESS_SCHEDULE_FILE": str(self.harness_schedule),
                       "AGENTOPS_HARNESS_SESSION_LEASE_SECONDS": str(soak_harness.SESSION_LEASE_SECONDS),
                       "AGENTOPS_AGENT_MODULES": AGENT_MODULES},
            tail_lines=60)
        self.workers = {name: self._start_worker(name) for name in self.links if name not in BEATS}
        self.beat = self._start_beat("beat")
        self.second_beat: Proc | None = None
        self.cluster.wait_ready(*self.workers.values(), self.beat)

    def _links(self) -> dict[str, Forwarder]:
        """Forwarders of one process to PostgreSQL and to Redis, on loopback ports of their own."""
        pg = urlsplit(self.database_url)
        if not pg.hostname:
            raise SystemExit(f"--postgres-url must name a TCP host and port to forward to, not {self.database_url}")
        return {"db": Forwarder(["127.0.0.1"], 0, (pg.hostname, pg.port or 5432)),
                "broker": Forwarder(["127.0.0.1"], 0, ("127.0.0.1", self.redis.port))}

    def _forwarders(self) -> list[Forwarder]:
        return [f for links in self.links.values() for f in links.values()]

    def _reach(self, name: str) -> dict[str, str]:
        """The database and broker URLs of process ``name``: through its own forwarders."""
        pg = urlsplit(self.database_url)
        auth = pg.netloc.rpartition("@")[0]
        netloc = f"{auth + '@' if auth else ''}127.0.0.1:{self.links[name]['db'].port}"
        return {"DATABASE_URL": urlunsplit((pg.scheme, netloc, pg.path, pg.query, pg.fragment)),
                "CELERY_BROKER_URL": f"redis://127.0.0.1:{self.links[name]['broker'].port}/0"}

    def _migrate(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_"))}
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=REPO_ROOT,
                              env={**env, "DATABASE_URL": self.database_url, "CELERY_BROKER_URL": self.redis.url},
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"manage.py migrate failed:\n{done.stdout}{done.stderr}")

    def _setup_django(self) -> None:
        for name in [k for k in os.environ if k.startswith("ANTHROPIC_")]:
            del os.environ[name]
        os.environ.update({
            "DATABASE_URL": self.database_url, "CELERY_BROKER_URL": self.redis.url,
            "DJANGO_SETTINGS_MODULE": "agentops.settings", "AGENTOPS_VAR_DIR": str(self.run_dir / "var"),
            "AGENTOPS_WORKSPACE_DIR": str(self.run_dir / "workspaces"), "AGENTOPS_LOG_LEVEL": "ERROR",
            "AGENTOPS_MODEL_PROVIDER": "scripted", "AGENTOPS_DEPLOY_TARGET_URL": self.target.url,
        })
        os.environ["AGENTOPS_AGENT_MODULES"] = AGENT_MODULES
        import django

        django.setup()
        from django.contrib.auth.models import Group, User

        approver = User.objects.create_user(APPROVER, password="soak-approver-password")
        approver.groups.add(Group.objects.get_or_create(name=APPROVER_GROUP)[0],
                            Group.objects.get_or_create(name=HARNESS_APPROVER_GROUP)[0])
        self.approver = approver
        self.requester = User.objects.create_user(REQUESTER, password="soak-requester-password")
        self.repo = self._git_repo(self.run_dir / "repo")

    @staticmethod
    def _git_repo(path: Path) -> Path:
        identity = ["-c", "user.name=agentops soak", "-c", "user.email=soak@agentops.local"]
        shutil.rmtree(path, ignore_errors=True)  # a run before with this seed left one
        path.mkdir(parents=True)
        (path / "check.py").write_text(TEST_SCRIPT)
        subprocess.run(["git", "init", "-q", str(path)], check=True)
        subprocess.run(["git", "-C", str(path), "add", "."], check=True)
        subprocess.run(["git", *identity, "-C", str(path), "commit", "-qm", "initial"], check=True)
        return path

    def teardown(self) -> None:
        cluster = getattr(self, "cluster", None)
        if cluster is not None:
            cluster.stop_all()
        for link in self._forwarders():
            link.close()
        target = getattr(self, "target", None)
        if target is not None:
            target.stop()
        server = getattr(self, "redis", None)
        if server is not None:
            server.shutdown_nosave()
        if hasattr(self, "pg") and not self.args.keep_db:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:  # Django may never have started
                pass
            self.pg.drop(self.args.database)

    # --- the run ---

    def run(self) -> Figures:
        started = time.monotonic()
        self.log(f"seed {self.seed}: {len(self.plans)} agents ({Counter(p.kind + ':' + p.action for p in self.plans)}),"
                 f" {len(self.schedule)} faults over {self.args.seconds:.0f} s "
                 f"({dict(Counter(f.kind for f in self.schedule))})")
        try:
            self.setup()
            self.log(f"database {self.args.database}, Redis on port {self.redis.port}, deploy target {self.target.url},"
                     f" {len(self.workers)} workers and a beat ready; logs in {self.cluster.log_dir}")
            self.t0 = time.monotonic()
            self._nemesis_phase()
            self._heal()
            healed = time.monotonic()
            converged = self._converge()
            self.figures.converge_s = round(time.monotonic() - healed, 1) if converged else None
            self._check()
        except Exception as exc:  # the figures so far and the reason, never a bare traceback
            self.figures.violations.append(f"the soak itself failed: {type(exc).__name__}: {exc}"[:4000])
            traceback.print_exc()
        finally:
            self.figures.wall_s = round(time.monotonic() - started, 1)
            self._collect_fault_figures()
            try:
                self.teardown()
            except Exception as exc:
                self.log(f"tear-down failed: {exc!r}")
        return self.figures

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _nemesis_phase(self) -> None:
        pending_launch = list(self.plans)
        pending_faults = list(self.schedule)
        while self._now() < self.args.seconds or pending_launch:
            now = self._now()
            while pending_launch and pending_launch[0].launch_at <= now:
                self._launch(pending_launch.pop(0))
            while pending_faults and pending_faults[0].at <= now:
                fault = pending_faults.pop(0)
                if not self._inject(fault.kind) and fault.deferred < MAX_DEFERRALS:
                    # Nothing to hit right now (e.g. every other worker is paused): try again shortly.
                    pending_faults.append(FaultEvent(at=now + 1.0, kind=fault.kind, deferred=fault.deferred + 1))
                    pending_faults.sort(key=lambda f: f.at)
            self._run_later(now)
            self._drive_bounded()
            self._watch_exits()
            time.sleep(TICK_SECONDS)

    def _run_later(self, now: float, *, everything: bool = False) -> None:
        due = [item for item in self.later if everything or item[0] <= now]
        self.later = [item for item in self.later if item not in due]
        for _, what, do in sorted(due, key=lambda item: item[0]):
            try:
                do()
            except Exception as exc:
                self.figures.violations.append(f"could not {what}: {exc!r}")

    # --- the agents and the people ---

    def _launch(self, plan: Plan) -> None:
        from workflows import services

        if plan.kind == "release":
            params = {"repo": str(self.repo), "test_command": "python3 check.py"}
            wf = services.workflow_launch(kind="release", goal=f"Ship soak release {plan.n}", params=params,
                                          user=self.requester)
        elif plan.kind == "tree":
            wf = services.workflow_launch(kind=soak_tree.ROOT_KIND, goal=f"Ship soak tree {plan.n}", params=plan.params,
                                          user=self.requester,
                                          options=services.LaunchOptions(budget_total_usd=soak_tree.ROOT_BUDGET_USD))
        elif plan.kind == "harness":
            wf = services.workflow_launch(kind="harness", goal=soak_harness.goal(plan),
                                          params=soak_harness.plan_params(plan.action), user=self.requester)
        else:
            wf = services.workflow_launch(kind="autonomous", goal=f"Write soak notes {plan.n}", user=self.requester)
        plan.workflow_id = wf.pk

    def _drive_bounded(self) -> None:
        """``_drive``, waiting at most DRIVER_LOCK_TIMEOUT_MS for any row lock. A worker stopped or cut
        off inside a transaction holds its rows until the nemesis resumes or heals it, and the nemesis's
        undo actions run in this loop: a request that waited for such a lock without end would stop
        the soak. Each service is atomic and idempotent, so what timed out is asked again next tick."""
        from django.db import OperationalError, connection

        with connection.cursor() as cursor:
            cursor.execute(f"SET lock_timeout = {DRIVER_LOCK_TIMEOUT_MS}")
        try:
            self._drive()
        except OperationalError as exc:
            if not lock_timed_out(exc):
                raise
            self.decisions["waited for a row lock: asked again"] += 1
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")

    def _drive(self) -> None:
        """What people do: decide open approvals per plan, change their minds when planned."""
        from workflows.models import Wait

        self._drive_harness()
        self._drive_trees()
        by_id = {p.workflow_id: p for p in self.plans if p.workflow_id is not None and p.kind == "release"}
        waits = Wait.objects.filter(kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN, workflow_id__in=list(by_id))
        for wait in waits:
            plan = by_id[wait.workflow_id]
            if plan.action == "park":
                continue
            if plan.action in ("cancel", "supersede") and plan.change_before_approval and not plan.changed:
                self._change_mind(plan)
                continue
            if not self._decide(wait, plan, what="", comment="soak: not this one"):
                continue
            plan.approvals += 1
            if plan.approved_at is None:
                plan.approved_at = self._now()
        for plan in by_id.values():
            if plan.action in ("cancel", "supersede") and plan.approved_at is not None and not plan.changed \
                    and self._now() >= plan.approved_at + plan.change_after:
                self._change_mind(plan)

    def _decide(self, wait: Any, plan: Plan, *, what: str, comment: str) -> bool:
        """Reject or approve ``wait`` as ``plan`` says (approving twice where it says so), counted
        in the decisions under ``what``; True when it was approved."""
        from django.db import OperationalError

        from workflows import services
        from workflows.errors import AgentOpsError

        try:
            if plan.action == "reject":
                services.wait_reject(wait_id=wait.pk, user=self.approver, comment=comment)
                self.decisions[f"{what}rejected"] += 1
                return False
            services.wait_approve(wait_id=wait.pk, user=self.approver, candidate_hash=wait.candidate_hash)
            self.decisions[f"{what}approved"] += 1
            if plan.approve_twice:
                try:
                    again = services.wait_approve(wait_id=wait.pk, user=self.approver,
                                                  candidate_hash=wait.candidate_hash)
                    self.decisions[f"{what}second approval {again.outcome.value}"] += 1
                except OperationalError as exc:  # the first one stands: the workflow it woke holds the lock
                    if not lock_timed_out(exc):
                        raise
                    self.decisions[f"{what}second approval waited for a row lock"] += 1
        except AgentOpsError as exc:  # e.g. invalidated by a new goal between the query and the decision
            self.decisions[f"{what}refused {type(exc).__name__}"] += 1
            return False
        return True

    def _drive_trees(self) -> None:
        """Cancel or supersede the trees whose plans say so, when they say so (``soak_tree.wants_change``)."""
        from workflows import services
        from workflows.errors import TransitionRefused
        from workflows.models import Workflow

        waiting = {p.workflow_id: p for p in self.plans if p.kind == "tree" and p.workflow_id is not None
                   and p.action != "complete" and not p.changed}
        if not waiting:
            return
        children: dict[int, list[Any]] = {}
        for child in Workflow.objects.filter(parent_id__in=list(waiting)).only("pk", "parent_id", "status"):
            children.setdefault(child.parent_id, []).append(child)
        for pk, plan in waiting.items():
            if not soak_tree.wants_change(plan, self._now(), children.get(pk, [])):
                continue
            plan.changed_after_child = plan.action.endswith("_after_child")
            try:
                if plan.action.startswith("cancel"):
                    services.workflow_cancel(workflow_id=pk, reason="soak: tree cancelled", user=self.requester)
                    plan.changed = "cancelled"
                else:
                    services.workflow_supersede(workflow_id=pk, goal=f"Ship soak tree {plan.n}, v2",
                                                user=self.requester)
                    plan.changed = "superseded"
            except TransitionRefused:  # it had already ended: a legitimate race, the oracle allows it
                plan.changed = f"{plan.action.split('_')[0]}_refused"
            self.decisions[f"tree {plan.changed}"] += 1

    def _drive_harness(self) -> None:
        """Decide the harness agents' feature lists and proposals per plan; resume the pauses the "resume"
        plans wait for."""
        from workflows import services
        from workflows.errors import AgentOpsError
        from workflows.models import Wait, Workflow

        by_id = {p.workflow_id: p for p in self.plans if p.workflow_id is not None and p.kind == "harness"}
        for wait in Wait.objects.filter(kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN, workflow_id__in=list(by_id)):
            plan = by_id[wait.workflow_id]
            if plan.action == "park":
                continue
            what = "harness proposal " if (wait.candidate or {}).get("kind") == "feature_change" else "harness "
            self._decide(wait, plan, what=what, comment="soak: not this list")
        paused = Workflow.objects.filter(pk__in=[pk for pk, p in by_id.items() if p.action == "resume"],
                                         status=Workflow.Status.PAUSED, pause_cause=Workflow.PauseCause.DEFINITION)
        for pk in paused.values_list("pk", flat=True):
            plan = by_id[pk]
            plan.paused_seen = self._now() if plan.paused_seen is None else plan.paused_seen
            if self._now() < plan.paused_seen + plan.resume_after:
                continue
            try:
                services.workflow_resume(workflow_id=pk, user=self.approver)
                plan.resumed += 1
                plan.paused_seen = None
                self.decisions["harness resumed"] += 1
            except AgentOpsError as exc:
                self.decisions[f"harness resume refused {type(exc).__name__}"] += 1

    def _change_mind(self, plan: Plan) -> None:
        from workflows import services
        from workflows.errors import TransitionRefused

        assert plan.workflow_id is not None
        try:
            if plan.action == "cancel":
                services.workflow_cancel(workflow_id=plan.workflow_id, reason="soak: cancelled", user=self.requester)
                plan.changed = "cancelled"
            else:
                services.workflow_supersede(workflow_id=plan.workflow_id, goal=f"Ship soak release {plan.n}, v2",
                                            user=self.requester)
                plan.changed = "superseded"
        except TransitionRefused:  # it had already finished: a legitimate race, the oracle allows it
            plan.changed = f"{plan.action}_refused"
        self.decisions[plan.changed] += 1

    # --- the nemesis ---

    def _live_workers(self) -> list[tuple[str, Proc]]:
        return [(n, p) for n, p in sorted(self.workers.items()) if p.alive() and n not in self.paused]

    def _inject(self, kind: str) -> bool:
        done = getattr(self, f"_fault_{kind}")()
        if done:
            self.faults[kind] += 1
            self.log(f"fault {kind}: {done}")
        else:
            self.skipped[kind] += 1
        return bool(done)

    def _fault_worker_kill(self) -> str:
        live = self._live_workers()
        if len(live) < 2:
            return ""
        name, proc = self.rng.choice(live)
        self.killed.add(proc.pid)
        proc.kill_group(signal.SIGKILL)
        self._later(self.rng.uniform(*RESTART_AFTER_SECONDS), f"restart worker {name}",
                    lambda: self._restart_worker(name, skew=self.skews.get(name)))
        return f"SIGKILL {name} (pid {proc.pid})"

    def _fault_worker_pause(self) -> str:
        live = self._live_workers()
        if len(live) < 2:
            return ""
        name, proc = self.rng.choice(live)
        # A threads worker has no pool processes: all of it stops, or nothing would.
        pool_only = self.rng.random() < 0.5 and not self._io_worker(name)
        seconds = self.rng.uniform(*PAUSE_SECONDS)
        proc.pause(pool_only=pool_only)
        self.paused.add(name)

        def resume() -> None:
            self.paused.discard(name)
            if proc.alive():
                proc.resume()

        self._later(seconds, f"resume worker {name}", resume)
        return f"SIGSTOP {'pool of ' if pool_only else ''}{name} for {seconds:.1f} s"

    def _fault_beat_restart(self) -> str:
        if not self.beat.alive():
            return ""
        self.killed.add(self.beat.pid)
        self.beat.kill_group(signal.SIGKILL)
        self._later(self.rng.uniform(*RESTART_AFTER_SECONDS), "restart beat", self._restart_beat)
        return "SIGKILL beat"

    def _fault_second_beat(self) -> str:
        if self.second_beat is not None and self.second_beat.alive():
            return ""
        self.second_beat = beat2 = self._start_beat("beat2")
        seconds = self.rng.uniform(*SECOND_BEAT_SECONDS)

        def stop() -> None:
            self.killed.add(beat2.pid)
            beat2.stop()

        self._later(seconds, "stop the second beat", stop)
        return f"a second beat for {seconds:.1f} s"

    def _fault_broker_restart(self) -> str:
        if not self.redis.up():
            return ""
        self.redis.shutdown_nosave()
        self._later(self.rng.uniform(*RESTART_AFTER_SECONDS), "restart Redis", self.redis.start)
        return "Redis SHUTDOWN NOSAVE"

    def _fault_broker_flush(self) -> str:
        if not self.redis.up():
            return ""
        size = self.redis.client().dbsize()
        self.redis.client().flushall()
        return f"FLUSHALL ({size} keys in DB 0)"

    def _fault_pg_terminate(self) -> str:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            row = cursor.fetchone()
        count = int(row[0]) if row else 0
        self.pg_terminated += count
        return f"pg_terminate_backend of {count} connections" if count else ""

    def _fault_target_drop(self) -> str:
        """The deploy target makes the next deployments, then drops the connection before answering."""
        count = self.rng.randint(1, 3)
        self.target.set_fault({"mode": "accept_then_drop", "count": count})
        return f"the deploy target accepts, then drops, the next {count} POSTs"

    def _fault_kill_after_accept(self) -> str:
        live = [(n, p) for n, p in self._live_workers() if n not in self.armed]
        if len(self._live_workers()) < 2 or not live:
            return ""
        name, proc = self.rng.choice(live)
        self.killed.add(proc.pid)
        proc.kill_group(signal.SIGKILL)
        self._restart_worker(name, skew=self.skews.get(name), armed=True)
        return f"restarted {name} to die right after the deploy target accepts its next deploy"

    def _fault_partition(self) -> str:
        """Cut one worker or beat off from PostgreSQL, Redis or both, for a few seconds (``Forwarder.cut``).

        Its open connections stall and its new ones are accepted but never answered until the
        heal, as across a real partition: no reset, no refusal. A process killed outright, a
        backend terminated and a broker restarted already come with an error at once (the other
        kinds); a partition is the case where nothing comes back, and only timeouts and leases
        tell the rest of the system that the process is gone.
        """
        beats = [b for b in (self.beat, self.second_beat) if b is not None and b.alive()]
        names = [n for n, _ in self._live_workers()] + [b.name for b in beats]
        names = [n for n in names if not any(f.is_cut for f in self.links[n].values())]
        if not names:
            return ""
        name = self.rng.choice(names)
        services = self.rng.choice(PARTITION_CUTS)
        seconds = self.rng.uniform(*PARTITION_SECONDS)
        for service in services:
            self.links[name][service].cut()
        self.partitions["+".join(services)] += 1
        if name in BEATS:
            self.partitions["of_a_beat"] += 1

        def heal() -> None:
            for service in services:
                self.links[name][service].heal()

        self._later(seconds, f"heal the partition of {name}", heal)
        return f"cut {name} off from {' and '.join(services)} for {seconds:.1f} s"

    def _fault_clock_skew(self) -> str:
        """Restart a worker with its wall clock off by another offset (set right again, a third of the time)."""
        live = self._live_workers()
        if len(live) < 2:
            return ""
        name, proc = self.rng.choice(live)
        offset = 0 if self.skews.get(name) and self.rng.random() < 1 / 3 else \
            self.rng.choice((-1, 1)) * self.rng.randint(*SKEW_SECONDS)
        self.killed.add(proc.pid)
        proc.kill_group(signal.SIGKILL)
        self._restart_worker(name, skew=offset)
        return f"restarted {name} with its wall clock {offset:+d} s off" if offset else \
            f"restarted {name} with its wall clock set right"

    def _fault_release_change(self) -> str:
        """A new release: every live worker stopped (SIGTERM, SIGKILL after the grace) and started again
        with a new prompt version, which it announces; waiting workflows revalidate when woken, or keep
        course where their tree already made an effect (``release.kept_course``)."""
        live = [(n, p) for n, p in sorted(self.workers.items()) if p.alive()]
        if not live:
            return ""
        self.prompt_version = f"soak-prompt-{self.faults['release_change'] + 1}"
        for _, proc in live:
            self.killed.add(proc.pid)
        self.cluster.stop([proc for _, proc in live])
        for name, _ in live:
            self.paused.discard(name)
            self._restart_worker(name, skew=self.skews.get(name))
        return f"restarted {len(live)} workers on prompt version {self.prompt_version}"

    def _later(self, seconds: float, what: str, do: Callable[[], None]) -> None:
        self.later.append((self._now() + seconds, what, do))

    def _restart_worker(self, name: str, *, skew: int | None, armed: bool | None = None) -> None:
        """Start worker ``name`` again; ``armed`` None keeps it armed (KILL_AFTER_ACCEPT) if it was."""
        env = faketime.faketime_env(skew) if skew else None
        self.skews.pop(name, None)
        if skew:
            self.skews[name] = skew
        armed = name in self.armed if armed is None else armed
        self.armed.discard(name)
        if armed:
            self.armed.add(name)
        self.workers[name] = self._start_worker(name, env=env, faults=KILL_AFTER_ACCEPT if armed else None)

    def _start_worker(self, name: str, *, env: dict[str, str] | None = None,
                      faults: list[dict[str, Any]] | None = None) -> Proc:
        """The last ``--io-workers`` workers: threads pools on the I/O queue with a pool of database
        connections (the README's worker for model-heavy agents); the others prefork, every queue."""
        shape: dict[str, Any] = {}
        if self.prompt_version:
            env = {"AGENTOPS_PROMPT_VERSION": self.prompt_version, **(env or {})}
        if self._io_worker(name):
            shape = {"pool": "threads", "concurrency": IO_THREADS, "queues": (IO_QUEUE,)}
            env = {"AGENTOPS_DB_POOL_SIZE": str(IO_DB_POOL_SIZE), **(env or {})}
        return self.cluster.start_worker(name, extra_env={**self._reach(name), **(env or {})}, ready=False,
                                         faults=faults, **shape)

    def _io_worker(self, name: str) -> bool:
        return int(name[1:]) > self.args.workers - self.args.io_workers

    def _start_beat(self, name: str) -> Proc:
        return self.cluster.start_beat(name, ready=False, extra_env=self._reach(name))

    def _restart_beat(self) -> None:
        self.beat = self._start_beat("beat")

    def _watch_exits(self) -> None:
        """A process that exits without the nemesis ending it is a finding (and is started again)."""
        for name, proc in list(self.workers.items()):
            if not proc.alive() and proc.pid not in self.killed:
                self.figures.unexpected_exits.append(f"worker {name} pid {proc.pid} exited {proc.popen.returncode}: "
                                                     f"{proc.log_tail(5)[-400:]}")
                self.killed.add(proc.pid)
                self._restart_worker(name, skew=self.skews.get(name))
        if not self.beat.alive() and self.beat.pid not in self.killed:
            self.figures.unexpected_exits.append(f"beat pid {self.beat.pid} exited {self.beat.popen.returncode}: "
                                                 f"{self.beat.log_tail(5)[-400:]}")
            self.killed.add(self.beat.pid)
            self._restart_beat()

    def _heal(self) -> None:
        """Undo every fault now: heal the partitions, resume, restart, stop the second beat, bring the broker back."""
        self._run_later(self._now(), everything=True)
        for link in self._forwarders():
            link.heal()  # the pending heals above did; the heal does not rest on the nemesis's bookkeeping
        self.target.set_fault({"mode": "none"})
        if not self.redis.up():
            self.redis.start()
        for name, proc in list(self.workers.items()):
            if proc.alive():
                proc.resume()  # harmless when it was not stopped
            if proc.alive() and name in self.armed:
                self.killed.add(proc.pid)
                proc.kill_group(signal.SIGKILL)
            if not proc.alive() and proc.pid in self.killed:
                self._restart_worker(name, skew=self.skews.get(name), armed=False)
        if not self.beat.alive():
            self._restart_beat()
        self._watch_exits()
        self.cluster.wait_ready(*self.workers.values(), self.beat)
        self.log(f"healed: {len(self.workers)} workers ({len(self.skews)} with a skewed clock) and one beat; "
                 f"faults injected {dict(self.faults)}")

    # --- convergence and the checks ---

    def _tree_children(self) -> list[int]:
        """The workflows the trees' roots started (and theirs), which no plan names."""
        root_of = soak_tree.members([p.workflow_id for p in self.plans if p.kind == "tree" and p.workflow_id])
        return [pk for pk, root in root_of.items() if pk != root]

    def _unconverged(self) -> list[str]:
        from workflows.models import Activity, Wait, Workflow

        children = self._tree_children()
        ids = [p.workflow_id for p in self.plans if p.workflow_id is not None]
        rows = {pk: (status, node) for pk, status, node in
                Workflow.objects.filter(pk__in=ids).values_list("pk", "status", "current_node")}
        busy = set(Activity.objects.filter(workflow_id__in=ids + children, status__in=("scheduled", "running"))
                   .values_list("workflow_id", flat=True))
        open_approvals = set(Wait.objects.filter(workflow_id__in=ids, kind="approval", status="open")
                             .values_list("workflow_id", flat=True))
        harness = Workflow.objects.filter(pk__in=[p.workflow_id for p in self.plans if p.kind == "harness"]).in_bulk()
        out = []
        for plan in self.plans:
            status, node = rows[plan.workflow_id] if plan.workflow_id in rows else ("not launched", "")
            parked = plan.action == "park" and status == "waiting" and plan.workflow_id in open_approvals
            if plan.kind == "harness" and plan.workflow_id in harness:
                parked = soak_harness.at_rest(plan, harness[plan.workflow_id], plan.workflow_id in open_approvals)
            if (status not in Workflow.TERMINAL and not parked) or plan.workflow_id in busy:
                out.append(f"{plan.kind}:{plan.action} workflow {plan.workflow_id} {status} at {node}"
                           + (" with live work" if plan.workflow_id in busy else ""))
        for pk, parent, status, node in Workflow.objects.filter(pk__in=children).values_list(
                "pk", "parent_id", "status", "current_node"):
            if status not in Workflow.TERMINAL or pk in busy:
                out.append(f"tree child workflow {pk} (of {parent}) {status} at {node}"
                           + (" with live work" if pk in busy else ""))
        return out

    def _converge(self) -> bool:
        deadline = time.monotonic() + self.args.converge_timeout
        last_report = 0.0
        while True:
            self._drive_bounded()
            self._watch_exits()
            left = self._unconverged()
            if not left:
                self.log("converged")
                return True
            if time.monotonic() >= deadline:
                self.figures.stuck = len(left)
                self.figures.violations.append(
                    f"{len(left)} workflows did not converge within {self.args.converge_timeout:.0f} s: {left[:20]}")
                print(self._dump(left), flush=True)
                return False
            if time.monotonic() - last_report > 15:
                self.log(f"waiting for {len(left)} workflows, e.g. {left[:3]}")
                last_report = time.monotonic()
            time.sleep(0.5)

    def _dump(self, left: list[str]) -> str:
        from workflows.models import Activity, Event

        lines = ["--- unconverged workflows ---"]
        for plan in self.plans:
            if plan.workflow_id is None or not any(f"workflow {plan.workflow_id} " in s for s in left):
                continue
            lines.append(f"workflow {plan.workflow_id} ({plan.kind}:{plan.action}, changed={plan.changed!r})")
            for a in Activity.objects.filter(workflow_id=plan.workflow_id).order_by("pk"):
                lines.append(f"  {a.operation_id} {a.name} {a.status} attempt={a.attempt} next={a.next_attempt_at} "
                             f"lease={a.lease_expires_at} error={a.error[:120]!r}")
            for e in Event.objects.filter(workflow_id=plan.workflow_id).order_by("-seq")[:15][::-1]:
                lines.append(f"  #{e.seq} {e.created_at:%H:%M:%S.%f} {e.kind} {json.dumps(e.data, default=str)[:160]}")
        lines.append(self.cluster.logs(lines=40))
        return "\n".join(lines)

    def _check(self) -> None:
        from workflows.models import Activity, Event, UsageEntry, Wait, Workflow

        v = self.figures.violations
        ids = [p.workflow_id for p in self.plans if p.workflow_id is not None]
        rows = {w.pk: w for w in Workflow.objects.filter(pk__in=ids)}
        outcomes: Counter[str] = Counter()
        for plan in self.plans:
            wf = rows[plan.workflow_id] if plan.workflow_id is not None else None
            outcome = self._judge(plan, wf, v)
            outcomes[f"{plan.kind}:{plan.action}:{outcome}"] += 1
        self.figures.outcomes = dict(sorted(outcomes.items()))
        # The trees' children are the soak's workflows too: their effects, ledger and events are checked.
        children = self._tree_children()
        ids += children
        rows |= {w.pk: w for w in Workflow.objects.filter(pk__in=children)}
        tally: Counter[str] = Counter()
        for plan in self.plans:
            if plan.kind == "harness" and plan.workflow_id in rows:
                try:
                    soak_harness.check(plan, rows[plan.workflow_id], v, tally)
                except Exception as exc:  # a check that cannot be made is a violation, not a pass
                    v.append(f"harness workflow {plan.workflow_id}: could not be checked: {exc!r}"[:600])
        self.figures.harness = dict(tally) | {"resumed": sum(p.resumed for p in self.plans)}
        self.figures.workflows = dict(Counter(p.kind for p in self.plans)) | {"tree_children": len(children),
                                                                              "total": len(self.plans)}
        self._check_effects(rows, v)

        # The ledger against the calls the histories recorded.
        calls = Event.objects.filter(workflow_id__in=ids, kind="model.called")
        answered = [e.data for e in calls if "error" not in e.data]
        charged = UsageEntry.objects.filter(workflow_id__in=ids, status="charged")
        charged_keys = set(charged.values_list("key", flat=True))
        uncharged = [d for d in answered if not any(k.startswith(f"{d['operation_id']}#{d['call']}@{d['attempt']}.")
                                                    for k in charged_keys)]
        statuses = Counter(UsageEntry.objects.filter(workflow_id__in=ids).values_list("status", flat=True))
        self.figures.ledger = {"model_calls_recorded": len(answered),
                               "failed_calls_recorded": len(calls) - len(answered), "uncharged_calls": len(uncharged),
                               **{f"rows_{k}": n for k, n in statuses.items()}}
        if uncharged:
            v.append(f"{len(uncharged)} model calls without a charged ledger row, e.g. {uncharged[:3]}")
        if statuses.get("reserved"):
            v.append(f"{statuses['reserved']} ledger rows still reserved after convergence")

        for pk in ids:
            seqs = list(Event.objects.filter(workflow_id=pk).order_by("seq").values_list("seq", flat=True))
            if seqs != list(range(1, len(seqs) + 1)) or (pk in rows and rows[pk].event_seq != len(seqs)):
                v.append(f"workflow {pk}: event sequence is not contiguous: {seqs[:5]}…{seqs[-5:]} "
                         f"(event_seq {rows[pk].event_seq if pk in rows else '?'})")
        live = Activity.objects.filter(workflow_id__in=ids, status__in=("scheduled", "running")).count()
        if live and not self.figures.stuck:
            v.append(f"{live} activities still scheduled or running after convergence")
        events = Counter(Event.objects.filter(workflow_id__in=ids).values_list("kind", flat=True))
        self.figures.recovery = {k: events.get(k, 0) for k in (
            "activity.lease_expired", "activity.stale_result_discarded", "activity.doorbell_ignored",
            "activity.voided", "workflow.handler_failed", "sweep.row_failed", "timer.ignored")}
        raised = Event.objects.filter(workflow_id__in=ids, kind__in=("sweep.row_failed", "workflow.handler_failed"))
        self.figures.failures_seen = sorted({
            f"{e.kind} {e.data.get('sweep') or e.data.get('node', '')}: {e.data.get('error_type')}: "
            f"{str(e.data.get('message'))[:160]}" for e in raised})
        self.figures.recovery["reconciled_attempts"] = Event.objects.filter(
            workflow_id__in=ids, kind="activity.succeeded", data__reconciled=True).count()
        self.figures.recovery["pg_backends_terminated"] = self.pg_terminated
        fired = Counter(f["point"] for f in self.cluster.faults_fired())
        self.figures.recovery["killed_after_accept"] = fired["activity.after_external_call"]
        self.figures.harness["killed_mid_session"] = fired["harness.after_tool"]
        self.figures.recovery["open_approvals_left"] = Wait.objects.filter(
            workflow_id__in=ids, kind="approval", status="open").count()
        self.figures.decisions = dict(self.decisions)
        for kind in self.kinds:
            if not self.faults.get(kind):
                v.append(f"fault {kind} was never injected (a run without it proves nothing about it); "
                         f"run longer or with another seed")

    def _judge(self, plan: Plan, wf: Any, v: list[str]) -> str:
        """The outcome of one workflow, and a violation when its plan does not allow it."""
        if wf is None:
            v.append(f"plan {plan.n} ({plan.kind}:{plan.action}) was never launched")
            return "not launched"
        reason = wf.reason or ""
        if wf.status == "failed" and reason.startswith("activity ") and " failed" in reason:
            return "failed_by_faults"  # an activity out of attempts: failed with its reason, allowed
        if plan.kind == "tree" and wf.status == "failed" and reason.startswith("child ") and "activity " in reason:
            return "failed_by_faults"  # a child's activity out of attempts: the root fails, its effects undone
        if wf.status == "failed" and _out_of_attempts_to_faults(wf):
            return "failed_by_faults"  # a definition that fails in its own words when an activity runs out
        if plan.kind == "harness":
            allowed = soak_harness.allowed(plan.action)
        elif plan.kind == "tree":
            allowed = soak_tree.allowed(plan)
        else:
            allowed = {
                "approve": {"completed"}, "supersede": {"completed"}, "run": {"completed"},
                "reject": {"failed"}, "park": {"waiting"},
                "cancel": {"cancelled"} if plan.changed == "cancelled" else {"cancelled", "completed"},
            }[plan.action]
        if plan.action == "cancel" and plan.changed == "cancel_refused":
            allowed = {"completed", "failed"}
        if wf.status not in allowed:
            v.append(f"workflow {wf.pk} ({plan.kind}:{plan.action}, {plan.changed or 'no change of mind'}) ended "
                     f"{wf.status} at {wf.current_node}, allowed {sorted(allowed)}: {reason[:200]!r}")
        return str(wf.status)

    def _check_effects(self, rows: dict[int, Any], v: list[str]) -> None:
        """Effects per operation identity, read from the deploy target's own state file."""
        state = json.loads(self.deploy_state.read_text()) if self.deploy_state.exists() else {
            "effects": {}, "deployments": {}, "tombstones": {}}
        effects: dict[str, dict[str, int]] = state["effects"]
        duplicates = [k for k, c in effects.items() if c["created"] > 1 or c["deleted"] > 1]
        self.figures.duplicates = len(duplicates)
        if duplicates:
            v.append(f"{len(duplicates)} operation identities with more than one effect: "
                     f"{ {k: effects[k] for k in duplicates[:5]} }")
        live_by_wf: dict[int, list[str]] = {}
        orphans = []
        for key, counts in effects.items():
            owner = _workflow_of(key)
            if owner not in rows:
                orphans.append(key)
            if counts["created"] > counts["deleted"]:
                live_by_wf.setdefault(owner, []).append(key)
        if orphans:
            v.append(f"effects owned by no workflow of the soak: {orphans[:5]}")
        lost = 0
        keys_by_wf: dict[int, list[str]] = {}
        for key in effects:
            keys_by_wf.setdefault(_workflow_of(key), []).append(key)
        unchanged = {p.workflow_id for p in self.plans if p.action == "approve" or p.changed.endswith("_refused")}
        for pk, wf in rows.items():
            live = live_by_wf.get(pk, [])
            if wf.kind != "release":
                continue
            if pk in unchanged and len(keys_by_wf.get(pk, [])) > 1:
                # Nobody changed their mind: one goal, one deployment, under one operation identity.
                v.append(f"workflow {pk} deployed under {len(keys_by_wf[pk])} operation identities: {keys_by_wf[pk]}")
            if wf.status == "completed":
                deployment = state["deployments"].get((wf.result or {}).get("deployment_id", ""))
                if deployment is None or deployment["status"] != "deployed" or live != [deployment["idempotency_key"]]:
                    lost += 1
                    v.append(f"completed workflow {pk} does not own exactly its one live deployment: live={live}, "
                             f"result={wf.result}")
            elif live:
                v.append(f"workflow {pk} ended {wf.status} but owns live deployments {live}")
        self.figures.lost = lost
        try:
            self.figures.trees = soak_tree.check(self.plans, effects, _workflow_of, v)
        except Exception as exc:  # a check that cannot be made is a violation, not a pass
            v.append(f"the trees could not be checked: {exc!r}"[:600])
        self.figures.effects = {
            "operation_ids": len(effects), "created": sum(c["created"] for c in effects.values()),
            "deleted": sum(c["deleted"] for c in effects.values()), "live": sum(len(x) for x in live_by_wf.values()),
            "tombstones": len(state.get("tombstones", {})),
        }

    def _collect_fault_figures(self) -> None:
        links = self._forwarders()
        self.figures.partitions = dict(sorted(self.partitions.items())) | {
            "stalled_transfers": sum(f.stalled for f in links), "held_connects": sum(f.held for f in links)}
        self.figures.faults = dict(sorted(self.faults.items()))
        self.figures.faults_skipped = dict(sorted(self.skipped.items()))
        self.figures.faults["total"] = sum(self.faults.values())


def lock_timed_out(exc: BaseException) -> bool:
    """Whether a database error is PostgreSQL's lock_timeout (the driver's bounded wait)."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


def _workflow_of(key: str) -> int:
    """``<installation id>/wf-12/COMMIT_OPERATION.7/i1/0~<nonce>`` (or the bare operation id an activity
    scheduled before installation ids sends) → 12; -1 for a key of another shape."""
    parts = key.split("/", 2)
    head = parts[1] if len(parts) > 1 and not parts[0].startswith("wf-") else parts[0]
    return int(head[3:]) if head.startswith("wf-") and head[3:].isdigit() else -1


def report(figures: Figures) -> str:
    f = figures
    lines = [
        f"soak seed {f.seed}: {f.seconds:.0f} s of faults, {f.wall_s:.0f} s in all",
        f"  workflows       {f.workflows}",
        f"  outcomes        {f.outcomes}",
        f"  faults          {f.faults}" + (f" (skipped: {f.faults_skipped})" if f.faults_skipped else ""),
        f"  partitions      {f.partitions}",
        f"  effects         {f.effects}",
        f"  duplicates      {f.duplicates}",
        f"  lost            {f.lost}",
        f"  stuck           {f.stuck}",
        f"  converge_s      {f.converge_s}",
        f"  ledger          {f.ledger}",
        f"  harness         {f.harness}",
        f"  trees           {f.trees}",
        f"  recovery        {f.recovery}",
        f"  decisions       {f.decisions}",
        f"  unexpected exits {len(f.unexpected_exits)}" + "".join(f"\n    {x}" for x in f.unexpected_exits),
        f"  failures seen   {len(f.failures_seen)}" + "".join(f"\n    {x}" for x in f.failures_seen),
    ]
    if f.violations:
        lines.append(f"FAILED: {len(f.violations)} violations (replay with --seed {f.seed}):")
        lines += [f"  - {x}" for x in f.violations]
    else:
        lines.append(f"OK: no violations (seed {f.seed})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    soak = Soak(args)
    print(f"soak seed {soak.seed} (replay: python -m bench.soak --seed {soak.seed} --seconds {args.seconds:g})",
          flush=True)
    figures = soak.run()
    print(report(figures), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(asdict(figures), indent=2, default=str))
    return 1 if figures.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
