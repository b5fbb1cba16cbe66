"""Model providers behind one interface: anthropic when ANTHROPIC_API_KEY is set, else the offline scripted one."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agentops.providers.base import ModelProvider, ModelResponse, Usage
from agentops.providers.scripted import ScriptedProvider
from workflows.activity_context import ActivityContext
from workflows.errors import Permanent

__all__ = ["ModelProvider", "ModelResponse", "Usage", "current_release_spec", "get_provider", "provider_for"]

TOOL_VERSIONS = {"git": "1", "test-runner": "1", "deploy-target": "1", "workspace-tools": "1"}


def get_provider(release: Mapping[str, Any] | None = None) -> ModelProvider:
    """The provider of the current release (settings), or of ``release`` (its provider and model)."""
    name = release["provider"] if release else settings.AGENTOPS_MODEL_PROVIDER
    if name == "scripted":
        model = release["model"].removeprefix("scripted/") if release else settings.AGENTOPS_MODEL
        return ScriptedProvider(model=model)
    if name == "anthropic":
        from agentops.providers.anthropic import AnthropicProvider  # the SDK takes seconds to import

        return AnthropicProvider.from_settings(model=release["model"] if release else None)
    raise ImproperlyConfigured(f"AGENTOPS_MODEL_PROVIDER={name!r} is not a provider; use 'anthropic' or 'scripted'.")


def provider_for(ctx: ActivityContext) -> ModelProvider:
    """The provider an activity's model calls go to: the pinned release's provider and model when
    its workflow pins one, else the current one.

    Raises Permanent when the pinned release's prompts or tools are not the ones this worker's
    code carries: it cannot run the pinned behaviour, and running another would break the pin.
    """
    pinned = ctx.release
    if pinned is None:
        return get_provider()
    current = {"prompt_version": settings.AGENTOPS_PROMPT_VERSION, "tool_versions": TOOL_VERSIONS}
    moved = [key for key, value in current.items() if pinned.get(key) != value]
    if moved:
        raise Permanent(
            f"Workflow {ctx.workflow_id} is pinned to a release with "
            + ", ".join(f"{key} {pinned.get(key)!r}" for key in moved)
            + "; this worker runs " + ", ".join(f"{key} {current[key]!r}" for key in moved)
            + ". It cannot run the pinned behaviour: run the activity on a worker of that release, or "
            "launch the work again under the current one."
        )
    return get_provider(pinned)


def current_release_spec() -> dict[str, Any]:
    """The provider, model, prompt and tool versions that new work runs on."""
    provider = get_provider()
    return {
        "provider": provider.name,
        "model": provider.model,
        "prompt_version": settings.AGENTOPS_PROMPT_VERSION,
        "tool_versions": TOOL_VERSIONS,
    }
