"""The operator actions on a workflow's page (cancel, pause, resume, change the goal or the budget,
steer) and the launch form: their forms, when each applies, and the service each calls."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages

from workflows import registry, services
from workflows.admin.display import usd
from workflows.admin.reasoning import is_budget_paused
from workflows.models import Workflow
from workflows.models.steering import MAX_STEER_CHARS
from workflows.rules import BUDGET_DIGITS, BUDGET_PLACES, BUDGET_STEP, MAX_BUDGET_USD
from workflows.selectors import definition_of
from workflows.services.labels import MAX_LABELS
from workflows.services.launch_options import HELP
from workflows.services.steps import MAX_GOAL_CHARS, MAX_HOURS


def reason_field(help_text: str) -> forms.CharField:
    """An optional reason, recorded on the workflow and in its history (cancel, pause)."""
    return forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
                           help_text=help_text)



class CancelForm(forms.Form):
    reason = reason_field("Recorded on the workflow and in its history; say why, for whoever reads it later.")



class SupersedeForm(forms.Form):
    goal = forms.CharField(
        max_length=MAX_GOAL_CHARS, widget=forms.Textarea(attrs={"rows": 5, "cols": 80}),
        help_text="The new goal, in the requester's words. It becomes the next intent version.",
    )
    # Made when the page is shown: the form sent twice (a double click, a resent POST) is one supersede.
    request_key = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)



class ResumeForm(forms.Form):
    pass



class PauseForm(forms.Form):
    reason = reason_field("Recorded on the workflow and in its history with your name; say why, for whoever "
                          "resumes it.")



class SteerForm(forms.Form):
    message = forms.CharField(
        max_length=MAX_STEER_CHARS, widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text="What to tell the agent. Its next model call receives it as a user turn; the goal stays.",
    )
    # Made when the page is shown: the form sent twice (a double click, a resent POST) is one message.
    request_key = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)



def _positive_usd(value: Decimal) -> None:
    if value <= 0:
        raise forms.ValidationError("A budget must be a positive amount of USD, such as 2.50.")



class BudgetForm(forms.Form):
    total_usd = forms.DecimalField(
        label="Total budget (USD)", required=False, max_digits=BUDGET_DIGITS, decimal_places=BUDGET_PLACES,
        validators=[_positive_usd], max_value=MAX_BUDGET_USD - BUDGET_STEP,
        help_text="Model spend allowed over the whole run. Over it, the workflow pauses for a person. "
                  "Empty keeps the current value.",
    )
    hourly_usd = forms.DecimalField(
        label="Hourly budget (USD)", required=False, max_digits=BUDGET_DIGITS, decimal_places=BUDGET_PLACES,
        validators=[_positive_usd], max_value=MAX_BUDGET_USD - BUDGET_STEP,
        help_text="Model spend allowed in any hour. Over it, work waits until the last hour's spend falls under "
                  "it. Empty keeps the current value.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and data.get("total_usd") is None and data.get("hourly_usd") is None:
            raise forms.ValidationError("Give a total budget, an hourly budget or both.")
        return data



@dataclass(frozen=True)
class OperatorAction:
    name: str
    label: str
    form: type[forms.Form]
    statuses: tuple[str, ...]

    def refusal(self, workflow: Workflow) -> str:
        """Why this action does not apply to ``workflow`` now; empty when it does (the page offers it)."""
        if workflow.status not in self.statuses:
            return f"Workflow {workflow.pk} is {workflow.status}; “{self.label}” does not apply to it."
        definition = definition_of(workflow) if self.name == "steer" else None
        if self.name == "steer" and (definition is None or not definition.reads_steering):
            return (f"Workflow {workflow.pk} is a {workflow.kind} workflow, whose model calls do not read steer "
                    "messages.")
        if self.name == "resume" and is_budget_paused(workflow):
            return (f"Workflow {workflow.pk} is paused because its budget ran out; resuming would pause it again. "
                    "Change its budget instead: that resumes it.")
        return ""



ACTIONS = {
    "cancel": OperatorAction("cancel", "Cancel workflow", CancelForm,
                             ("created", "running", "waiting", "paused")),
    "pause": OperatorAction("pause", "Pause workflow", PauseForm, ("running", "waiting")),
    "resume": OperatorAction("resume", "Resume workflow", ResumeForm, ("paused", "running", "cancelling")),
    "supersede": OperatorAction("supersede", "Change the goal", SupersedeForm,
                                ("created", "running", "waiting", "paused")),
    "budget": OperatorAction("budget", "Change budget", BudgetForm, ("created", "running", "waiting", "paused")),
    "steer": OperatorAction("steer", "Steer the agent", SteerForm, ("created", "running", "waiting", "paused")),
}



PARAM_PREFIX = "param_"



def _sentence(help_text: str) -> str:
    return help_text[:1].upper() + help_text[1:] + "."


def launch_option_fields() -> dict[str, forms.Field]:
    """The launch options (``services.LaunchOptions``) as form fields, each with its help from
    ``launch_options.HELP``; empty ones launch as the kind declares."""
    def amount(label: str, name: str) -> forms.DecimalField:
        return forms.DecimalField(label=label, required=False, max_digits=BUDGET_DIGITS, decimal_places=BUDGET_PLACES,
                                  validators=[_positive_usd], max_value=MAX_BUDGET_USD - BUDGET_STEP,
                                  help_text=_sentence(HELP[name]))
    return {
        "priority": forms.IntegerField(label="Priority", required=False, min_value=0, max_value=10, initial=5,
                                       help_text=_sentence(HELP["priority"])),
        "budget_total_usd": amount("Total budget (USD)", "budget_total_usd"),
        "budget_hourly_usd": amount("Hourly budget (USD)", "budget_hourly_usd"),
        "max_hours": forms.FloatField(label="Time limit (hours)", required=False, min_value=0.001,
                                      max_value=MAX_HOURS, help_text=_sentence(HELP["max_hours"])),
        "release_policy": forms.ChoiceField(
            label="Release policy", required=False, help_text=_sentence(HELP["release_policy"]),
            choices=[("", "the kind's default"), *Workflow.ReleasePolicy.choices]),
        "stagnation_policy": forms.ChoiceField(label="Stagnation policy", required=False,
                                               choices=Workflow.StagnationPolicy.choices,
                                               initial=Workflow.StagnationPolicy.RECORD,
                                               help_text=_sentence(HELP["stagnation_policy"])),
        "fallback_model": forms.CharField(label="Fallback model", required=False, max_length=120,
                                          help_text=_sentence(HELP["fallback_model"])),
    }


class LaunchForm(forms.Form):
    option_names: tuple[str, ...] = ()  # the fields that are launch options


def launch_form(kind: str) -> type[LaunchForm]:
    """The launch form of ``kind``: its goal, a text field per declared launch parameter (text, as
    `--param KEY=VALUE` gives it: the kind's declaration reads it, its description and default as
    the help), its labels and the launch options (``option_names``, shown apart)."""
    fields: dict[str, Any] = {
        "kind": forms.CharField(widget=forms.HiddenInput),
        "goal": forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=MAX_GOAL_CHARS,
                                help_text="What the agent should achieve."),
    }
    model = registry.definition(kind).launch_params if kind else None
    for name, info in (model.model_fields.items() if model is not None else ()):
        default = "" if info.is_required() else f" Default: {info.default}."
        fields[f"{PARAM_PREFIX}{name}"] = forms.CharField(
            label=name, required=info.is_required(), max_length=10_000,
            help_text=f"{info.description or ''}{default}".strip())
    fields["labels"] = forms.CharField(
        required=False, max_length=MAX_LABELS * 193,
        help_text=f"Labels to find it by: key=value, separated by spaces or commas, at most {MAX_LABELS} (e.g. "
                  "team=infra env=prod). A key: lowercase letters, digits, _ and -, starting with a letter; a "
                  "value: letters, digits and . _ - : / @ +.")
    options = launch_option_fields()
    fields |= options
    fields["option_names"] = tuple(options)
    return type("LaunchForm", (LaunchForm,), fields)


def perform_action(action: str, workflow_id: int, data: dict[str, Any], user: Any) -> tuple[str, int]:
    """Call the service for ``action``; return the message for the operator and its level."""
    if action == "cancel":
        result = services.workflow_cancel(workflow_id=workflow_id, reason=data["reason"], user=user)
        already = result.outcome == services.Outcome.ALREADY_APPLIED
        return result.message, messages.WARNING if already else messages.SUCCESS
    if action == "budget":
        was_paused = is_budget_paused(Workflow.objects.get(pk=workflow_id))
        workflow = services.workflow_budget_set(
            workflow_id=workflow_id, user=user, total_usd=data["total_usd"], hourly_usd=data["hourly_usd"])
        total, hourly = workflow.budget_total_usd, workflow.budget_hourly_usd
        text = (f"Budget of workflow {workflow_id}: total {usd(total) if total is not None else 'unlimited'}, "
                f"hourly {usd(hourly) if hourly is not None else 'unlimited'}.")
        if was_paused and workflow.status == Workflow.Status.RUNNING:
            text += " It was paused for budget and goes on now."
        return text, messages.SUCCESS
    if action == "pause":
        result = services.workflow_pause(workflow_id=workflow_id, reason=data["reason"], user=user)
        return result.message, messages.WARNING if result.outcome == services.Outcome.ALREADY_APPLIED else \
            messages.SUCCESS
    if action == "steer":
        steered = services.workflow_steer(workflow_id=workflow_id, message=data["message"], user=user,
                                          dedupe_key=data.get("request_key", ""))
        return steered.message, (messages.WARNING if steered.outcome == services.Outcome.ALREADY_APPLIED
                                 else messages.SUCCESS)
    if action == "resume":
        result = services.workflow_resume(workflow_id=workflow_id, user=user)
        level = {services.Outcome.APPLIED: messages.SUCCESS, services.Outcome.HANDLER_FAILED: messages.ERROR}
        return result.message, level.get(result.outcome, messages.WARNING)
    result = services.workflow_supersede(workflow_id=workflow_id, goal=data["goal"], user=user,
                                         idempotency_key=data.get("request_key", ""))
    return result.message, messages.WARNING if result.outcome == services.Outcome.ALREADY_APPLIED else messages.SUCCESS
