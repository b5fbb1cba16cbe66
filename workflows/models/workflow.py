"""The workflow, its goal versions, its history and its checkpoints."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from workflows.rules import BUDGET_DIGITS, BUDGET_PLACES


class BehavioralRelease(models.Model):
    """The model, prompt and tool versions a workflow was started with."""

    fingerprint = models.CharField(
        max_length=64, unique=True, help_text="SHA-256 over provider, model, prompt version and tool versions."
    )
    provider = models.CharField(max_length=40, help_text="Model provider name, e.g. 'scripted' or 'anthropic'.")
    model = models.CharField(max_length=120, help_text="Model identifier sent to the provider.")
    prompt_version = models.CharField(max_length=80, help_text="Version label of the prompts in use.")
    tool_versions = models.JSONField(default=dict, blank=True, help_text="Tool name to tool version.")
    created_at = models.DateTimeField(help_text="When this release was first seen.")
    announced_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When a Celery worker last started on this release; launches elsewhere (a shell, the admin) "
                  "record the most recently announced release, the one the workers run.",
    )

    class Meta:
        indexes = [models.Index(fields=["-announced_at"], name="release_announced_idx")]

    def __str__(self) -> str:
        return f"{self.provider}:{self.model} prompt={self.prompt_version} ({self.fingerprint[:10]})"

    def spec(self) -> dict[str, Any]:
        """Provider, model, prompt and tool versions, as ``workflows.releases`` describes a release."""
        return {"provider": self.provider, "model": self.model, "prompt_version": self.prompt_version,
                "tool_versions": self.tool_versions}


class Workflow(ConcurrentTransitionMixin, models.Model):
    """One agent run: a definition kind, a status, a current semantic node and durable state."""

    class Status(models.TextChoices):
        CREATED = "created"
        RUNNING = "running"
        WAITING = "waiting"
        PAUSED = "paused"
        CANCELLING = "cancelling"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class ReleasePolicy(models.TextChoices):
        PIN = "pin", "Pin: keep running on the release it started with"
        REVALIDATE = "revalidate", "Revalidate: adopt the new release and revalidate the candidate"
        FAIL = "fail", "Fail: stop the workflow when its release changed"

    class StagnationPolicy(models.TextChoices):
        REPLAN = "replan", "Re-plan: go to the definition's adaptation node"
        PAUSE = "pause", "Pause for a person"
        RECORD = "record", "Only record it"

    class PauseCause(models.TextChoices):
        BUDGET = "budget", "Budget exhausted"
        STAGNATION = "stagnation", "Stagnating"
        HANDLER_FAILED = "handler_failed", "Advancing kept failing (a node handler raised)"
        DEFINITION = "definition", "Its definition asks a person to decide"
        OPERATOR = "operator", "Paused by an operator (agent pause)"

    TERMINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
    CANCELLABLE = (Status.CREATED, Status.RUNNING, Status.WAITING, Status.PAUSED)
    # Not columns: what an advance reads with the row lock (``workflow_lock(advance=True)``).
    # (intent version, goal), which ``selectors.current_goal`` answers from while the workflow is
    # at that version; (checkpoint id, state hash, chain length) of its last checkpoint, which
    # ``visits.enter_node`` chains the next one to; whether a child wait is open (False: none was,
    # and this transaction opened none, so leaving a node cancels no child without asking);
    # whether it has any steer message (False: a chained activity's first call needs not ask).
    goal_read: tuple[int, str] | None = None
    checkpoint_read: tuple[int, str, int] | None = None
    child_waits_open: bool | None = None
    steered_read: bool | None = None

    kind = models.CharField(max_length=60, db_index=True, help_text="Workflow definition kind, e.g. 'release'.")
    definition_version = models.PositiveIntegerField(
        default=1, help_text="Version of the definition recorded at launch; handlers branch on it."
    )
    status = FSMField(
        default=Status.CREATED, choices=Status.choices, protected=True, db_index=True,
        help_text="Lifecycle status; changes only through the workflow services.",
    )
    current_node = models.CharField(max_length=60, help_text="Semantic node the workflow is at.")
    node_visit = models.PositiveIntegerField(
        default=1, help_text="How many node entries so far; part of every operation identity."
    )
    intent_version = models.PositiveIntegerField(default=1, help_text="Version of the current intent (goal).")
    params = models.JSONField(default=dict, blank=True, help_text="Launch parameters (validated by the definition).")
    state = models.JSONField(default=dict, blank=True, help_text="Durable variables written by node handlers.")
    release = models.ForeignKey(
        BehavioralRelease, on_delete=models.PROTECT, related_name="workflows",
        help_text="Behavioral release the workflow runs on.",
    )
    release_policy = models.CharField(
        max_length=12, choices=ReleasePolicy.choices, default=ReleasePolicy.REVALIDATE,
        help_text="What to do on resume when the current release differs from this workflow's.",
    )
    release_provisional = models.BooleanField(
        default=False,
        help_text="The release was recorded from the settings of a process that launched before any worker "
                  "announced one; unless pinned, the first worker to call the model records and runs its own.",
    )
    fallback_model = models.CharField(
        max_length=120, blank=True, default="",
        help_text="Model the calls move to after AGENTOPS_FALLBACK_AFTER_THROTTLES throttled attempts in a row "
                  "(sustained overload); recorded as a release change when used. Empty: no fallback.",
    )
    launched_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="User who launched the workflow; may not approve its own candidates.",
    )
    result = models.JSONField(null=True, blank=True, help_text="Final result when completed.")
    reason = models.TextField(blank=True, help_text="Why the workflow failed, paused or was cancelled.")
    pause_cause = models.CharField(
        max_length=20, choices=PauseCause.choices, blank=True,
        help_text="Why the workflow is paused, for filters and code (the reason says it for people); "
                  "empty when it is not paused.",
    )
    handler_failures = models.PositiveSmallIntegerField(
        default=0, help_text="Advances in a row that raised (a node handler or a value it stored); a successful "
                             "advance resets it. At AGENTOPS_HANDLER_MAX_FAILURES the workflow pauses for a person.",
    )
    advance_retry_at = models.DateTimeField(
        null=True, blank=True, help_text="When a failed advance is tried again (beat rings the workflow then). "
                                         "Empty: no retry pending.",
    )
    event_seq = models.PositiveIntegerField(default=0, help_text="Sequence number of the last event recorded.")
    checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The latest checkpoint.",
    )
    priority = models.PositiveSmallIntegerField(
        default=5, help_text="0–10; work at 9 or above may pass the hourly budget, never the total."
    )
    budget_total_usd = models.DecimalField(
        max_digits=BUDGET_DIGITS, decimal_places=BUDGET_PLACES, null=True, blank=True,
        help_text="Total model spend allowed (USD); over it the workflow pauses for a person. Empty: no limit.",
    )
    budget_hourly_usd = models.DecimalField(
        max_digits=BUDGET_DIGITS, decimal_places=BUDGET_PLACES, null=True, blank=True,
        help_text="Model spend allowed in any hour (USD); over it work is deferred. Empty: no limit.",
    )
    stagnation_window_hours = models.FloatField(
        default=6.0, help_text="Progress must move 5 points within this window, or the workflow is stagnating."
    )
    stagnation_policy = models.CharField(
        max_length=10, choices=StagnationPolicy.choices, default=StagnationPolicy.RECORD,
        help_text="What beat does when the workflow stagnates.",
    )
    stagnation_flagged_at = models.DateTimeField(
        null=True, blank=True, help_text="When stagnation was last flagged (once per window)."
    )
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="Time limit of the whole run, if any; past it, beat cancels the workflow."
    )
    created_at = models.DateTimeField(help_text="When the workflow was launched.")
    updated_at = models.DateTimeField(help_text="When the workflow row last changed.")
    history_archived_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When retention (AGENTOPS_RETENTION_DAYS) moved this finished workflow's checkpoints and events "
                  "to the archive file; empty: its whole history is in the database.",
    )
    history_archive_path = models.CharField(
        max_length=1000, blank=True, default="",
        help_text="The archive file its checkpoints and events were moved to (JSON Lines, `agent export-history`'s "
                  "format); `manage.py agent export-history ID` prints it.",
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children", db_index=False,
        help_text="The workflow that started this one as a child (ctx.child); empty for a workflow launched by a "
                  "person, a schedule or the API.",
    )
    parent_wait = models.ForeignKey(  # indexed by uniq_child_per_wait
        "Wait", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False,
        help_text="The parent's child wait this workflow answers (its operation id is the child's identity); "
                  "unique: starting a child twice starts one (constraint uniq_child_per_wait).",
    )
    history_archive_claimed_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When a retention run claimed this workflow to archive it; another run takes the claim over "
                  "after AGENTOPS_RETENTION_CLAIM_SECONDS (the first one died).",
    )

    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks", db_index=False,
        help_text="The workflow this one was forked from (`agent fork`); empty for a launch.",
    )
    forked_from_visit = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The original's node visits this fork reused (1 to N): it started at visit N + 1 from the state "
                  "the original entered that visit with.",
    )

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Workflow] = models.Manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["parent_wait"], name="uniq_child_per_wait",
                                    condition=Q(parent_wait__isnull=False)),
        ]
        indexes = [
            models.Index(
                fields=["updated_at"], name="wf_running_updated_idx", condition=Q(status__in=["running", "cancelling"])
            ),
            models.Index(
                fields=["deadline"], name="wf_open_deadline_idx",
                condition=Q(status__in=["created", "running", "waiting", "paused"]),  # CANCELLABLE
            ),
            models.Index(
                fields=["updated_at"], name="wf_finished_unarchived_idx",
                condition=Q(status__in=["completed", "failed", "cancelled"], history_archived_at__isnull=True),
            ),
            # A child's and a fork's link, where there is one: most workflows have neither, and their
            # rows' writes add no entry here.
            models.Index(fields=["parent"], name="wf_parent_idx", condition=Q(parent__isnull=False)),
            models.Index(fields=["forked_from"], name="wf_forked_from_idx", condition=Q(forked_from__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"workflow {self.pk} ({self.kind}, {self.status} at {self.current_node})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def status_as_read(self) -> str:
        """The status this instance was read or last saved with: a save finding another one in the
        row refuses (``ConcurrentTransitionMixin``)."""
        return str(self._ConcurrentTransitionMixin__initial_states["status"])  # type: ignore[attr-defined]

    def status_saved(self) -> None:
        """The status it holds was written (``workflows.services.common.workflow_save``)."""
        self._update_initial_state()

    @property
    def history_archived(self) -> bool:
        """Retention moved its checkpoints and events to ``history_archive_path``."""
        return self.history_archived_at is not None

    @transition(field=status, source=Status.CREATED, target=Status.RUNNING)
    def start(self, *, at: datetime) -> None:
        self.updated_at = at

    @transition(field=status, source=Status.RUNNING, target=Status.WAITING)
    def park(self, *, at: datetime) -> None:
        self.updated_at = at

    @transition(field=status, source=[Status.WAITING, Status.PAUSED], target=Status.RUNNING)
    def wake(self, *, at: datetime) -> None:
        self.updated_at = at
        self.pause_cause = ""

    @transition(field=status, source=[Status.RUNNING, Status.WAITING], target=Status.PAUSED)
    def pause(self, *, at: datetime, reason: str, cause: str) -> None:
        self.updated_at = at
        self.reason = reason
        self.pause_cause = cause

    @transition(field=status, source=Status.RUNNING, target=Status.COMPLETED)
    def complete(self, *, at: datetime, result: Any) -> None:
        self.updated_at = at
        self.result = result

    @transition(field=status, source=[Status.RUNNING, Status.WAITING, Status.PAUSED], target=Status.FAILED)
    def fail(self, *, at: datetime, reason: str) -> None:
        self.updated_at = at
        self.reason = reason
        self.pause_cause = ""

    @transition(
        field=status, source=[Status.CREATED, Status.RUNNING, Status.WAITING, Status.PAUSED], target=Status.CANCELLING
    )
    def request_cancel(self, *, at: datetime, reason: str) -> None:
        self.updated_at = at
        self.reason = reason
        self.pause_cause = ""

    @transition(field=status, source=Status.CANCELLING, target=Status.CANCELLED)
    def finish_cancel(self, *, at: datetime) -> None:
        self.updated_at = at

    def enter_node(self, node: str, *, at: datetime) -> None:
        self.current_node = node
        self.node_visit += 1
        self.updated_at = at


class WorkflowLabel(models.Model):
    """One ``key=value`` label given at launch, to find and count workflows by (``agent list --label``,
    ``?label=`` in the API, the admin's filter, ``AGENTOPS_METRICS_LABELS``). A row per label, not a
    JSON column: an indexed (key, value) lookup on PostgreSQL and on the demo's SQLite alike."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="labels")
    key = models.CharField(max_length=63, help_text="Lowercase letters, digits, _ and -, starting with a letter.")
    value = models.CharField(max_length=128, help_text="Letters, digits and . _ - : / @ +, no spaces.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "key"], name="uniq_workflow_label_key")]
        indexes = [models.Index(fields=["key", "value"], name="workflow_label_kv_idx")]
        ordering = ["workflow", "key"]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class Intent(models.Model):
    """A version of the workflow's goal; a newer version supersedes the older ones."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="intents")
    version = models.PositiveIntegerField(help_text="1 for the launch goal, then 2, 3, … per supersession.")
    goal = models.TextField(help_text="What the agent should achieve, in the requester's words.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="Who set this goal.",
    )
    created_at = models.DateTimeField(help_text="When this version was recorded.")
    superseded_at = models.DateTimeField(null=True, blank=True, help_text="When a newer version replaced it.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "version"], name="uniq_intent_version")]
        ordering = ["workflow", "version"]

    def __str__(self) -> str:
        return f"intent v{self.version} of workflow {self.workflow_id}"


class Checkpoint(models.Model):
    """The durable state at a semantic boundary: what the node entry changed (``delta``), or the
    whole state (``delta`` empty), in stored form (``workflows.statestore``)."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="checkpoints",
                                 db_index=False)  # checkpoint_workflow_visit_idx leads with it
    node = models.CharField(max_length=60, help_text="Node being entered.")
    node_visit = models.PositiveIntegerField()
    intent_version = models.PositiveIntegerField()
    state = models.JSONField(
        default=dict, blank=True,
        help_text="The whole state entering this visit (stored form: long values are blob references) when "
                  "delta is empty; empty otherwise.")
    delta = models.JSONField(
        null=True, blank=True,
        help_text="What this node entry changed in the state, against the previous checkpoint's "
                  "(workflows.statestore.diff). Empty: this checkpoint holds the whole state.")
    state_hash = models.CharField(
        max_length=32, blank=True, default="",
        help_text="Hash of the stored state this checkpoint leads to; empty for checkpoints written before "
                  "delta checkpoints (each of them holds the whole state).")
    chain_bytes = models.PositiveIntegerField(
        default=0, help_text="Bytes of the deltas since the last whole checkpoint, this one included.")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["workflow", "node_visit"]
        indexes = [models.Index(fields=["workflow", "node_visit"], name="checkpoint_workflow_visit_idx")]

    def __str__(self) -> str:
        return f"checkpoint {self.node}#{self.node_visit} of workflow {self.workflow_id}"


class Event(models.Model):
    """Append-only history, with a contiguous sequence per workflow."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="events",
                                 db_index=False)  # uniq_event_seq leads with it
    seq = models.PositiveIntegerField(help_text="1, 2, 3, … per workflow, without gaps.")
    kind = models.CharField(max_length=60, help_text="Dotted event name, e.g. 'activity.succeeded'.")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "seq"], name="uniq_event_seq")]
        ordering = ["workflow", "seq"]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"


class StateBlob(models.Model):
    """A large value of a workflow's state or of an activity's result, stored once and referenced by
    its digest (``workflows.statestore``): a long string, or one element of a long list as JSON."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="blobs",
                                 db_index=False)  # uniq_state_blob leads with it
    digest = models.CharField(max_length=32, help_text="First 32 hex digits of the SHA-256 of the text.")
    data = models.TextField(help_text="The text: the string itself, or the JSON of a list element.")
    chars = models.PositiveIntegerField(help_text="Length of the text.")
    node_visit = models.PositiveIntegerField(help_text="The node visit that first stored it.")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "digest"], name="uniq_state_blob")]

    def __str__(self) -> str:
        return f"blob {self.digest[:12]} of workflow {self.workflow_id} ({self.chars} characters)"
