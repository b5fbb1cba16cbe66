"""Run a workflow in this process, against the database, as a worker would: the service tests'
and the long-run benchmark's stand-in for real workers (``workflows.testing.cluster`` runs those)."""
from __future__ import annotations

from datetime import timedelta

from workflows import clock, services
from workflows.models import Activity, Workflow


def drive(workflow_id: int, *, max_rounds: int = 50, worker: str = "in-process",
          retries_now: bool = False) -> Workflow:
    """Advance the workflow and run its due activities until nothing is runnable (or ``max_rounds``).

    ``retries_now``: an activity waiting for its retry window is run at once instead of skipped
    (a benchmark does not wait out backoffs)."""
    for _ in range(max_rounds):
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        scheduled = Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED)
        if retries_now:
            scheduled.update(next_attempt_at=clock.now() - timedelta(seconds=1))
        # Only what is due: a claim of one waiting for its retry window is refused, and asking again
        # and again would only record the refusals (a test moves the clock to the window instead).
        ids = list(scheduled.filter(next_attempt_at__lte=clock.now()).values_list("pk", flat=True))
        if not ids:
            break
        for pk in ids:
            services.activity_run_if_runnable(activity_id=pk, worker=worker)
    return Workflow.objects.get(pk=workflow_id)
