"""Summaries of py-spy's raw (collapsed-stack) output: where a worker's task time goes.

Only samples taken inside a Celery task (``trace_task``) count, idle ones included (``--idle``):
time spent waiting on PostgreSQL or Redis is what a step costs, and it is idle time to the CPU.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

# (label, substring of a frame), most specific first: a sample goes to the first category that any
# frame of its stack matches (a psycopg execute under the ORM counts as a round trip, not as ORM).
CATEGORIES = [
    ("connect to PostgreSQL", "connect (psycopg/connection.py"),
    ("connect to PostgreSQL", ".get_new_connection (django/db/backends"),
    ("connect to PostgreSQL", ".ensure_connection (django/db/backends"),
    ("close PostgreSQL connection", ".close (django/db/backends"),
    ("publish to Redis (Celery send_task)", "Celery.send_task (celery/app/base.py"),
    ("SQL round trips (psycopg execute)", "execute (psycopg/cursor.py"),
    ("SQL round trips (psycopg execute)", "._execute (django/db/backends"),
    ("COMMIT round trips", "Wrapper.commit (django/db/backends"),
    ("COMMIT round trips", "Wrapper._commit (django/db/backends"),
    ("Django ORM (building SQL, model instances)", "(django/db/models"),
    ("agentops engine and services (Python)", "(workflows/"),
    ("Celery task machinery", "(celery/"),
]


def _frames(stack: str) -> list[str]:
    return stack.split(";")


def summarize(raw: str, *, top: int = 25) -> dict[str, Any]:
    samples: list[tuple[list[str], int]] = []
    total_all = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total_all += int(count)
        frames = _frames(stack)
        if any("trace_task (celery/app/trace.py" in f for f in frames):
            samples.append((frames, int(count)))
    in_tasks = sum(c for _, c in samples)
    categories: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_task: Counter[str] = Counter()
    for frames, count in samples:
        for label, needle in CATEGORIES:
            if any(needle in f for f in frames):
                categories[label] += count
                break
        else:
            categories["other"] += count
        for f in set(frames):
            if "(workflows/" in f or "(tasks/" in f or "(bench/" in f:
                inclusive[f] += count
        task = next((f for f in frames if "(tasks/" in f), "")
        by_task[task.split(" ")[0] or "other"] += count

    def pct(n: int) -> float:
        return round(100 * n / in_tasks, 1) if in_tasks else 0.0

    lines = [f"py-spy samples: {total_all} in all, {in_tasks} inside Celery tasks (idle included)", "",
             "where task time goes (first matching category):"]
    lines += [f"  {pct(n):5.1f} %  {label}" for label, n in categories.most_common()]
    lines += ["", "by task:"] + [f"  {pct(n):5.1f} %  {name}" for name, n in by_task.most_common()]
    lines += ["", f"agentops functions by inclusive time (top {top}):"]
    lines += [f"  {pct(n):5.1f} %  {frame}" for frame, n in inclusive.most_common(top)]
    return {
        "samples_in_tasks": in_tasks,
        "categories_pct": {label: pct(n) for label, n in categories.most_common()},
        "tasks_pct": {name: pct(n) for name, n in by_task.most_common()},
        "top_functions_pct": {frame: pct(n) for frame, n in inclusive.most_common(12)},
        "text": "\n".join(lines) + "\n",
    }
