"""Model providers behind one interface: anthropic when ANTHROPIC_API_KEY is set, else the offline scripted one."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agentops.providers.base import ModelProvider, ModelResponse, Usage
from agentops.providers.scripted import ScriptedProvider

__all__ = ["ModelProvider", "ModelResponse", "Usage", "get_provider", "current_release_spec"]

TOOL_VERSIONS = {"git": "1", "test-runner": "1", "deploy-target": "1", "workspace-tools": "1"}


def get_provider() -> ModelProvider:
    name = settings.AGENTOPS_MODEL_PROVIDER
    if name == "scripted":
        return ScriptedProvider(model=settings.AGENTOPS_MODEL)
    if name == "anthropic":
        from agentops.providers.anthropic import AnthropicProvider  # the SDK takes seconds to import

        return AnthropicProvider.from_settings()
    raise ImproperlyConfigured(f"AGENTOPS_MODEL_PROVIDER={name!r} is not a provider; use 'anthropic' or 'scripted'.")


def current_release_spec() -> dict[str, Any]:
    """The provider, model, prompt and tool versions that new work runs on."""
    provider = get_provider()
    return {
        "provider": provider.name,
        "model": provider.model,
        "prompt_version": settings.AGENTOPS_PROMPT_VERSION,
        "tool_versions": TOOL_VERSIONS,
    }
