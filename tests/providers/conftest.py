"""Fixtures for the reasoning plane: the fake Anthropic Messages API and the product pointed at it."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.fakes.anthropic_api import FakeAnthropicAPI

MODEL = "claude-sonnet-5-5"
API_KEY = "sk-ant-test-0000-secret"


class RecordedSleeps(list[float]):
    """The SDK's in-process retry waits, recorded instead of slept."""


@pytest.fixture(autouse=True)
def sdk_sleeps(monkeypatch: pytest.MonkeyPatch) -> RecordedSleeps:
    """Only the SDK's ``time`` is replaced: the fake server and the workflows keep the real clock."""
    sleeps = RecordedSleeps()

    class SdkTime:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            sleeps.append(seconds)

    monkeypatch.setattr(anthropic._base_client, "time", SdkTime())
    return sleeps


@pytest.fixture
def anthropic_api() -> Iterator[FakeAnthropicAPI]:
    """A fake Messages API on loopback; a request it had no answer for fails the test."""
    api = FakeAnthropicAPI().start()
    yield api
    api.stop()
    assert not api.unexpected, f"requests the test did not script: {api.unexpected}"


@pytest.fixture
def claude(settings: Any, anthropic_api: FakeAnthropicAPI) -> FakeAnthropicAPI:
    """The product configured for Claude, its ANTHROPIC_BASE_URL pointing at the fake API."""
    settings.AGENTOPS_MODEL_PROVIDER = "anthropic"
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.ANTHROPIC_BASE_URL = anthropic_api.url
    settings.AGENTOPS_MODEL = MODEL
    settings.AGENTOPS_ANTHROPIC_MAX_RETRIES = 0
    return anthropic_api
