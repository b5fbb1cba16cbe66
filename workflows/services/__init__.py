"""Every write to durable state: lock, check, transition, save, record the event, ring the doorbell."""
from workflows.installation import idempotency_key_for, installation_ensure, installation_id
from workflows.services.activities import (
    RunOutcome,
    activity_checkpoint_if_current,
    activity_claim_if_runnable,
    activity_failure_record_if_current,
    activity_heartbeat_if_current,
    activity_lease_expire_if_due,
    activity_note_if_current,
    activity_result_record_if_current,
    activity_run_if_runnable,
)
from workflows.services.budgets import (
    budget_charge_once,
    budget_charge_write,
    budget_release_once,
    budget_reserve_ensure,
    budget_uncertain_once,
    usage_key,
    usage_report_parse,
    usage_reservations_settle_orphaned,
    usage_settle_from_report,
    workflow_budget_set,
    workflow_priority_set,
)
from workflows.services.cancellation import workflow_cancel, workflow_deadline_enforce_if_due
from workflows.services.intents import workflow_supersede
from workflows.services.launch_options import LaunchOptions
from workflows.services.pauses import workflow_pause, workflow_resume
from workflows.services.progress import stagnation_check, stagnation_flag_if_due
from workflows.services.signals import workflow_signal, workflow_signal_from_webhook
from workflows.services.steering import SteerResult, steering_take_if_current, workflow_steer
from workflows.services.steps import Outcome, Result
from workflows.services.sweeps import (
    activities_redrive_due,
    deadlines_enforce,
    leases_reap_expired,
    timers_fire_due,
    workflows_redrive_idle,
)
from workflows.services.waits import Decision, DecisionResult, timer_fire_if_due, wait_approve, wait_reject
from workflows.services.workflows import (
    workflow_advance_if_runnable,
    workflow_launch,
    workflow_launch_once,
)

__all__ = [
    "LaunchOptions",
    "Decision",
    "DecisionResult",
    "Outcome",
    "Result",
    "RunOutcome",
    "SteerResult",
    "activities_redrive_due",
    "activity_checkpoint_if_current",
    "activity_claim_if_runnable",
    "activity_failure_record_if_current",
    "activity_heartbeat_if_current",
    "activity_lease_expire_if_due",
    "activity_note_if_current",
    "activity_result_record_if_current",
    "activity_run_if_runnable",
    "budget_charge_once",
    "budget_charge_write",
    "budget_release_once",
    "budget_reserve_ensure",
    "budget_uncertain_once",
    "deadlines_enforce",
    "idempotency_key_for",
    "installation_ensure",
    "installation_id",
    "leases_reap_expired",
    "stagnation_check",
    "steering_take_if_current",
    "stagnation_flag_if_due",
    "timer_fire_if_due",
    "timers_fire_due",
    "usage_key",
    "usage_report_parse",
    "usage_reservations_settle_orphaned",
    "usage_settle_from_report",
    "wait_approve",
    "wait_reject",
    "workflow_advance_if_runnable",
    "workflow_budget_set",
    "workflow_priority_set",
    "workflow_cancel",
    "workflow_deadline_enforce_if_due",
    "workflow_launch",
    "workflow_launch_once",
    "workflow_pause",
    "workflow_resume",
    "workflow_signal",
    "workflow_signal_from_webhook",
    "workflow_steer",
    "workflow_supersede",
    "workflows_redrive_idle",
]
