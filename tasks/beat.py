"""Celery entry points for the beat sweeps; each is safe to run any number of times at once."""
from celery import shared_task


@shared_task(name="agentops.beat.fire_timers", acks_late=True)
def fire_timers() -> int:
    from workflows import services

    return services.timers_fire_due()


@shared_task(name="agentops.beat.redrive_activities", acks_late=True)
def redrive_activities() -> int:
    from workflows import services

    return services.activities_redrive_due()


@shared_task(name="agentops.beat.reap_leases", acks_late=True)
def reap_leases() -> int:
    from workflows import services

    return services.leases_reap_expired()


@shared_task(name="agentops.beat.redrive_workflows", acks_late=True)
def redrive_workflows() -> int:
    from workflows import services

    return services.workflows_redrive_idle()


@shared_task(name="agentops.beat.collect_children", acks_late=True)
def collect_children() -> int:
    from workflows.services import sweeps

    return sweeps.children_collect_due()


@shared_task(name="agentops.beat.enforce_deadlines", acks_late=True)
def enforce_deadlines() -> int:
    from workflows import services

    return services.deadlines_enforce()


@shared_task(name="agentops.beat.check_stagnation", acks_late=True)
def check_stagnation() -> int:
    from workflows import services

    return services.stagnation_check()


@shared_task(name="agentops.beat.remind_approvals", acks_late=True)
def remind_approvals() -> int:
    from workflows.features.notifications.services import approval_reminders_schedule_due

    return approval_reminders_schedule_due()


@shared_task(name="agentops.beat.fire_schedules", acks_late=True)
def fire_schedules() -> int:
    from workflows.features.schedules import services as schedules

    return schedules.schedules_fire_due()


@shared_task(name="agentops.schedules.fire", acks_late=True)
def fire_schedule(schedule_id: int) -> int:
    """A schedule's beat entry rings at each occurrence (docs/operators.md, "Schedules")."""
    from workflows.features.schedules import services as schedules

    return schedules.schedule_fire(schedule_id=schedule_id)


@shared_task(name="agentops.beat.archive_histories", acks_late=True)
def archive_histories() -> int:
    from workflows.features.retention import services as retention

    return retention.histories_archive_due()


@shared_task(name="agentops.beat.deliver_webhooks", acks_late=True)
def deliver_webhooks() -> int:
    from workflows.features.webhooks import services as hooks

    return hooks.webhooks_deliver_due()
