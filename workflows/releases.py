"""The behavioral release (provider, model, prompt and tool versions) and the provider a model call goes to.

Which classes are providers is configuration (AGENTOPS_MODEL_PROVIDERS: a name to a dotted path,
as Django names its backends); the kernel knows only their interface (``workflows.provider``).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from workflows.activity_context import ActivityContext
from workflows.errors import Permanent
from workflows.provider import ModelProvider


def get_provider(release: Mapping[str, Any] | None = None) -> ModelProvider:
    """The provider of the current release (settings), or of ``release`` (its provider and model):
    the class AGENTOPS_MODEL_PROVIDERS names for it, built by its ``from_settings``."""
    name = release["provider"] if release else settings.AGENTOPS_MODEL_PROVIDER
    path = settings.AGENTOPS_MODEL_PROVIDERS.get(name)
    if path is None:
        known = " or ".join(repr(known) for known in sorted(settings.AGENTOPS_MODEL_PROVIDERS))
        raise ImproperlyConfigured(f"AGENTOPS_MODEL_PROVIDER={name!r} is not a provider; use {known}.")
    provider: ModelProvider = import_string(path).from_settings(model=release["model"] if release else None)
    return provider


def provider_for(ctx: ActivityContext) -> ModelProvider:
    """The provider an activity's model calls go to: its workflow's release, never this worker's
    settings alone.

    The recorded release runs whenever this worker can run it: its prompts and tools are the
    ones this worker's code carries (a different provider or model is only configuration), and a
    worker announced it (a release recorded from the settings of a shell that launched before any
    worker started is provisional: unless pinned, the first worker to call the model records and
    runs its own instead). When the prompts or tools differ, the release policy decides: ``pin``
    raises Permanent (it cannot run the pinned behaviour, and running another would break the
    pin), ``fail`` raises Permanent naming both releases, and ``revalidate`` adopts this worker's
    release (``ctx.adopt_release``: recorded on the workflow with a ``release.changed`` event,
    fenced), so what the workflow shows, the simulated label included, is what ran. Without a
    recorded release (the test kit) the current one runs.

    On sustained overload (``AGENTOPS_FALLBACK_AFTER_THROTTLES`` throttled attempts in a row) a
    workflow with a fallback model moves its calls to it (``fallback_release``), except under
    ``pin``, whose model is part of what was pinned.
    """
    current = current_release_spec()
    recorded = ctx.release or current
    moved = [key for key in ("prompt_version", "tool_versions") if recorded.get(key) != current[key]]
    if not moved:
        fallback = fallback_release(ctx, recorded)
        if fallback is not None:
            ctx.adopt_release(fallback, why="fallback")
            return _provider_of(fallback, ctx)
        if release_fingerprint(recorded) == release_fingerprint(current):
            return get_provider()
        if not ctx.release_provisional or ctx.release_policy == "pin":
            return _provider_of(recorded, ctx)
        ctx.adopt_release(current, why="worker")
        return get_provider()
    differences = ", ".join(f"{key} {recorded.get(key)!r}" for key in moved) + "; this worker runs " + ", ".join(
        f"{key} {current[key]!r}" for key in moved)
    if ctx.release_policy == "pin":
        raise Permanent(
            f"Workflow {ctx.workflow_id} is pinned to a release with {differences}. It cannot run the pinned "
            "behaviour: run the activity on a worker of that release, or launch the work again under the current one."
        )
    if ctx.release_policy == "fail":
        raise Permanent(f"Workflow {ctx.workflow_id} runs on a release with {differences}, and its release policy "
                        "is 'fail': it stops rather than run another release.")
    ctx.adopt_release(current, why="worker")
    return get_provider()


def fallback_release(ctx: ActivityContext, release: Mapping[str, Any]) -> dict[str, Any] | None:
    """``release`` with the workflow's fallback model, when this attempt follows enough throttled
    ones in a row and the workflow has a fallback it is not already on; else None."""
    if not ctx.fallback_model or ctx.release_policy == "pin":
        return None
    if ctx.throttled_in_a_row < settings.AGENTOPS_FALLBACK_AFTER_THROTTLES:
        return None
    model = f"scripted/{ctx.fallback_model}" if release["provider"] == "scripted" else ctx.fallback_model
    if release["model"] == model:
        return None
    return {**release, "model": model}


def _provider_of(release: Mapping[str, Any], ctx: ActivityContext) -> ModelProvider:
    try:
        return get_provider(release)
    except ImproperlyConfigured as exc:
        raise Permanent(
            f"Workflow {ctx.workflow_id} runs on {release['provider']}:{release['model']}, which this worker cannot "
            f"call ({exc}). Configure the workers like the ones that started it, or launch the work again."
        ) from None


def release_fingerprint(spec: Mapping[str, Any]) -> str:
    """SHA-256 over a release's provider, model, prompt and tool versions (its identity)."""
    keys = ("provider", "model", "prompt_version", "tool_versions")
    return hashlib.sha256(json.dumps({k: spec[k] for k in keys}, sort_keys=True).encode()).hexdigest()


def current_release_spec() -> dict[str, Any]:
    """The provider, model, prompt and tool versions that new work runs on."""
    provider = get_provider()
    return {
        "provider": provider.name,
        "model": provider.model,
        "prompt_version": settings.AGENTOPS_PROMPT_VERSION,
        "tool_versions": settings.AGENTOPS_TOOL_VERSIONS,
    }
