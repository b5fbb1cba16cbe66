"""The anthropic provider: Claude through the official SDK's Messages API.

Errors are mapped here, once, to the agentops families: rate limits, overload, 5xx,
connection errors and timeouts become ``Retryable`` carrying the server's retry-after as a
stored retry window; everything retrying will not fix becomes ``Permanent`` with what to do.

The SDK retries a failed request itself (``AGENTOPS_ANTHROPIC_MAX_RETRIES``, 0–2) and honours
the server's retry-after while doing so, however long it is. A worker must not sleep through a
long wait, so a response that asks for more than ``INLINE_RETRY_WAIT_LIMIT_SECONDS`` is not
retried in-process: it surfaces at once as ``Retryable`` and the activity's next attempt is
stored for the moment the server named.

Importing this module imports the SDK (several seconds); ``agentops.providers`` imports it
only when the anthropic provider is selected.
"""
from __future__ import annotations

import contextvars
import dataclasses
import email.utils
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeGuard

import anthropic
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workflows.errors import AgentOpsError, Permanent, Retryable, Throttled
from workflows.provider import ModelResponse, RequestMeter, Usage
from workflows.ratelimits.limiter import RateLimitInfo

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.anthropic.com"
CONNECT_TIMEOUT_SECONDS = 5.0
# The longest server-requested wait the SDK may sleep through inside a worker; longer waits
# become stored retry windows (a ``Retryable`` with ``retry_after_seconds``).
INLINE_RETRY_WAIT_LIMIT_SECONDS = 10.0
OVERLOADED = 529  # the API's overloaded_error
CACHE_CONTROL: dict[str, Any] = {"type": "ephemeral"}
CACHE_CONTROL_1H: dict[str, Any] = {"type": "ephemeral", "ttl": "1h"}
# A token count is an estimate for the reservation; it must not hold a model call up for long.
COUNT_TOKENS_TIMEOUT_SECONDS = 5.0
# 429s that are not about request rate: retrying within hours will not help.
SPEND_LIMIT_CODES = frozenset({"enforced_spend_limit_reached", "contract_spend_limit_reached"})

# SDK clients shared by the threads of a process, in shards: httpx's connection pool does work in
# proportion to its connections on every request, so a threads worker with hundreds of calls in
# flight spreads them over CLIENT_SHARDS pools, each thread always on the same one.
CLIENT_SHARDS = 8
_shared_clients: dict[tuple[str, str, int, float, int], tuple[anthropic.Anthropic, anthropic.Anthropic]] = {}
_shared_clients_lock = threading.Lock()
_thread_shard = threading.local()
_shards_given = itertools.count()


def _shard_of_this_thread() -> int:
    shard: int | None = getattr(_thread_shard, "shard", None)
    if shard is None:
        shard = _thread_shard.shard = next(_shards_given) % CLIENT_SHARDS
    return shard


class AnthropicProvider:
    """``ModelProvider`` for Claude. ``http_client`` is for tests (an ``httpx2.MockTransport``)."""

    name = "anthropic"

    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        max_retries: int = 1,
        timeout_seconds: float = 120.0,
        base_url: str = DEFAULT_BASE_URL,
        http_client: httpx2.Client | None = None,
    ) -> None:
        if not api_key:
            raise ImproperlyConfigured(
                "ANTHROPIC_API_KEY is not set; set it to use the anthropic provider, "
                "or set AGENTOPS_MODEL_PROVIDER=scripted to run offline."
            )
        if not 0 <= max_retries <= 2:
            raise ImproperlyConfigured(f"AGENTOPS_ANTHROPIC_MAX_RETRIES={max_retries} must be 0, 1 or 2.")
        if not timeout_seconds > 0:
            raise ImproperlyConfigured(f"AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS={timeout_seconds} must be above 0.")
        self.model = model
        self.max_retries = max_retries
        self.timeout_seconds = float(timeout_seconds)
        self.base_url = base_url
        self._api_key = api_key
        self._http_client = http_client
        self._clients: tuple[anthropic.Anthropic, anthropic.Anthropic] | None = None  # (calls, token counts)

    @classmethod
    def from_settings(cls, *, model: str | None = None, http_client: httpx2.Client | None = None) -> AnthropicProvider:
        """The provider the settings configure; ``model`` overrides AGENTOPS_MODEL (a pinned release)."""
        return cls(
            api_key=settings.ANTHROPIC_API_KEY,
            model=model or settings.AGENTOPS_MODEL,
            max_retries=settings.AGENTOPS_ANTHROPIC_MAX_RETRIES,
            timeout_seconds=settings.AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS,
            base_url=settings.ANTHROPIC_BASE_URL,
            http_client=http_client,
        )

    def __repr__(self) -> str:  # never the key
        return f"AnthropicProvider(model={self.model!r}, base_url={self.base_url!r})"

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int,
        tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
        meter: RequestMeter | None = None, prefix_cache_ttl: str = "5m",
        on_delta: Callable[[dict[str, str]], None] | None = None,
    ) -> ModelResponse:
        request = cached_request(model=self.model, system=system, messages=messages, max_tokens=max_tokens,
                                 tools=tools, prefix_cache_ttl=prefix_cache_ttl)
        if tool_choice:
            request["tool_choice"] = tool_choice
        client = self._sdk()
        metering = _meter.set(meter)  # for Metered, the client's innermost middleware
        try:
            message: object
            if on_delta is None:
                answer = client.messages.with_raw_response.create(**request)
                # The body as JSON, which ``_response`` checks: the SDK's parse walks it again (60 µs a call).
                message, request_id = json.loads(answer.http_response.content), answer.request_id
            else:
                message, request_id = self._streamed(client, request, on_delta)
        except anthropic.AnthropicError as exc:
            raise self._mapped(exc) from None
        except json.JSONDecodeError as exc:  # the SDK lets a 2xx body that is not JSON through as is
            raise Retryable(
                f"The Anthropic API answered {self.model} with a body that is not JSON ({exc.msg}); it was not used "
                "and the activity will try again. If it keeps happening, check ANTHROPIC_BASE_URL points at the "
                "Messages API.", provider=self.name, retry_after_seconds=None,
            ) from None
        finally:
            _meter.reset(metering)
        return self._response(message, str(request_id or ""))

    @staticmethod
    def _streamed(client: anthropic.Anthropic, request: dict[str, Any],
                  on_delta: Callable[[dict[str, str]], None]) -> tuple[object, str | None]:
        """The same call, streamed: each text and tool-input delta goes to ``on_delta`` as it comes;
        the answer is the stream's final message (as JSON) and its request id, checked like any other."""
        with client.messages.stream(**request) as stream:
            for event in stream:
                if event.type == "text":
                    on_delta({"text": event.text})
                elif event.type == "input_json":
                    on_delta({"tool_input": event.partial_json})
            return stream.get_final_message().model_dump(mode="json", exclude_none=True), stream.request_id

    def count_tokens(
        self, *, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    ) -> int | None:
        """The API's own count of the request's input tokens (``/v1/messages/count_tokens``: free,
        rate-limited on its own), for the ledger's reservation; None when counting is off
        (AGENTOPS_ANTHROPIC_COUNT_TOKENS) or the count failed: the reservation then falls back to
        an estimate from the prompt's length, and the call itself goes ahead either way."""
        if not settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS:
            return None
        request: dict[str, Any] = {"model": self.model, "messages": messages}
        if system:
            request["system"] = system
        if tools:
            request["tools"] = tools
        try:
            counted = self._sdk(counting=True).messages.count_tokens(**request)
        except anthropic.AnthropicError as exc:
            log.info("anthropic.count_tokens.failed", extra={"model": self.model, "error": type(exc).__name__})
            return None
        tokens = getattr(counted, "input_tokens", None)
        return tokens if isinstance(tokens, int) and tokens >= 0 else None

    def _sdk(self, *, counting: bool = False) -> anthropic.Anthropic:
        """The SDK's client (made once and shared by the providers of the same settings); with
        ``counting``, its copy for token counts (no retries, a short timeout)."""
        if self._clients is None:
            if self._http_client is not None:
                self._clients = self._build_clients(self._http_client)
            else:
                key = (self._api_key, self.base_url, self.max_retries, self.timeout_seconds, _shard_of_this_thread())
                with _shared_clients_lock:
                    if key not in _shared_clients:
                        _shared_clients[key] = self._build_clients(None)
                    self._clients = _shared_clients[key]
        return self._clients[1 if counting else 0]

    def _build_clients(self, http_client: httpx2.Client | None) -> tuple[anthropic.Anthropic, anthropic.Anthropic]:
        client = self._build_client(http_client)
        return client, client.with_options(max_retries=0, timeout=COUNT_TOKENS_TIMEOUT_SECONDS)

    def _build_client(self, http_client: httpx2.Client | None) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            api_key=self._api_key,
            base_url=self.base_url,
            max_retries=self.max_retries,
            timeout=anthropic.Timeout(self.timeout_seconds, connect=min(CONNECT_TIMEOUT_SECONDS, self.timeout_seconds)),
            http_client=http_client,
            # The call's span is agentops's own ``chat <model>`` (workflows.telemetry, GenAI conventions); the
            # SDK's, on the global tracer provider, would duplicate it (and cost 40 µs a request).
            open_telemetry=False,
            # Metered innermost, inside the SDK's retry loop: it sees every HTTP request and its raw answer.
            middleware=[NoLongInlineRetries(), Metered()],
        )

    def _response(self, message: object, request_id: str) -> ModelResponse:
        """Check the answer's shape (the SDK does not) and turn it into a ``ModelResponse``.

        ``message`` is the answer's JSON as decoded (a streamed answer's final message, dumped):
        reading it is a tenth of what building the SDK's typed ``Message`` from it costs, on every call.
        """
        def malformed(what: str) -> Retryable:
            # A truncated or foreign body (a proxy's error page, a cut connection) is a glitch of the
            # way there, not of the work: the activity's retry policy bounds how often it is tried.
            return Retryable(
                f"The Anthropic API's answer for {self.model} is malformed ({what}); it was not used and the "
                "activity will try again. If the API or a proxy in between keeps answering like this, check "
                "ANTHROPIC_BASE_URL.", provider=self.name, request_id=request_id, retry_after_seconds=None,
            )

        if not isinstance(message, dict) or message.get("type") != "message":
            raise malformed(f"a {type(message).__name__}, not a message")
        blocks, stop_reason, usage = message.get("content"), message.get("stop_reason"), message.get("usage")
        if not isinstance(blocks, list):
            raise malformed("no content list")
        if not isinstance(stop_reason, str):
            raise malformed("no stop_reason")
        if not (isinstance(usage, dict) and _is_count(usage.get("input_tokens"))
                and _is_count(usage.get("output_tokens"))):
            raise malformed("no usage")
        texts: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        content: list[dict[str, Any]] = []
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text = block.get("text")
                if not isinstance(text, str):
                    raise malformed("a text block without text")
                texts.append(text)
                content.append({"type": "text", "text": text})
            elif kind == "tool_use":
                call = {"id": block.get("id"), "name": block.get("name"), "input": block.get("input")}
                if not (isinstance(call["id"], str) and isinstance(call["name"], str)
                        and isinstance(call["input"], dict)):
                    raise malformed("a tool_use block without id, name or input")
                tool_calls.append(call)
                content.append({"type": "tool_use", **call})
            elif isinstance(kind, str):
                content.append(_without_nulls(block))  # thinking, server tools: kept, sent back as they came
            else:
                raise malformed("a content block without a type")
        cache_creation = usage.get("cache_creation")
        counted = Usage(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            cache_read_input_tokens=_count(usage, "cache_read_input_tokens"),
            cache_creation_input_tokens=_count(usage, "cache_creation_input_tokens"),
            cache_creation_1h_input_tokens=(_count(cache_creation, "ephemeral_1h_input_tokens")
                                            if isinstance(cache_creation, dict) else 0),
        )
        if stop_reason == "refusal":
            details = message.get("stop_details")
            details = details if isinstance(details, dict) else {}
            category = details.get("category") or "unspecified"
            explanation = f": {details['explanation']}" if details.get("explanation") else ""
            raise Permanent(
                f"{self.model} declined the request (refusal, category {category}){explanation}. Retrying the same "
                "request will not change that; rephrase the goal or review what the workflow asked for.",
                provider=self.name, stop_reason="refusal", category=category, request_id=request_id,
                usage=dataclasses.asdict(counted),
            )
        return ModelResponse(text="".join(texts), stop_reason=stop_reason, usage=counted,
                             tool_calls=tool_calls, content=content, request_id=request_id)

    def _mapped(self, exc: anthropic.AnthropicError) -> AgentOpsError:
        """The one place SDK errors become agentops errors; messages never carry the key."""
        where = f"The Anthropic API ({self.model})"
        if isinstance(exc, anthropic.APIStatusError):
            status, request_id = exc.status_code, exc.request_id or ""
            detail = f"{status} {exc.type or 'error'}: {exc.api_message or 'no message'}"
            attrs: dict[str, Any] = {"provider": self.name, "status_code": status, "request_id": request_id}
            if isinstance(exc, anthropic.RateLimitError) and exc.error_code in SPEND_LIMIT_CODES:
                return Permanent(f"{where} refused the call: the organization's spend limit is reached ({detail}); "
                                 "raise it in the Claude Console, then retry the workflow.", **attrs)
            if isinstance(exc, anthropic.RateLimitError) or status in (408, 409) or status >= 500:
                wait = retry_after_seconds(exc.response.headers)
                when = f"the server asked to wait {wait:g} s" if wait is not None else "no retry-after given"
                # Rate limits and overloads say nothing about the work: they do not use up attempts.
                error = Throttled if isinstance(exc, anthropic.RateLimitError) or status == OVERLOADED else Retryable
                return error(f"{where} is rate limited or unavailable ({detail}); {when}, and the activity "
                             "will try again then.", retry_after_seconds=wait, **attrs)
            if isinstance(exc, anthropic.AuthenticationError):
                todo = "check ANTHROPIC_API_KEY (a valid, active key for this organization)"
            elif isinstance(exc, anthropic.PermissionDeniedError):
                todo = f"check that ANTHROPIC_API_KEY's workspace may use {self.model}"
            elif isinstance(exc, anthropic.NotFoundError):
                todo = f"check AGENTOPS_MODEL ({self.model!r}) names a current model and ANTHROPIC_BASE_URL is right"
            elif isinstance(exc, anthropic.PaymentRequiredError):
                todo = "check the organization's billing in the Claude Console"
            elif isinstance(exc, anthropic.ContentTooLargeError):
                todo = "trim the context the workflow sends"
            else:
                todo = "fix the request (prompt, tools or max_tokens); retrying it unchanged will fail again"
            return Permanent(f"{where} rejected the call ({detail}); {todo}.", **attrs)
        if isinstance(exc, anthropic.APITimeoutError):
            return Retryable(f"{where} did not answer within {self.timeout_seconds:g} s "
                             f"(AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS); the activity will try again.",
                             provider=self.name, retry_after_seconds=None)
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__
            return Retryable(f"{where} could not be reached ({type(cause).__name__ if cause else 'connection error'}); "
                             "the activity will try again.", provider=self.name, retry_after_seconds=None)
        if isinstance(exc, anthropic.APIResponseValidationError):
            return Permanent(f"{where} answered with data that does not fit the Messages API; it was not used.",
                             provider=self.name, status_code=exc.status_code)
        return Permanent(f"{where} call failed before it was sent ({type(exc).__name__}); "
                         "check ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL.", provider=self.name)


def cached_request(*, model: str, system: str, messages: list[dict[str, Any]], max_tokens: int,
                   tools: list[dict[str, Any]] | None, prefix_cache_ttl: str = "5m") -> dict[str, Any]:
    """The request body with its prompt-cache breakpoints (3 of the API's 4).

    The API renders tools, then system, then messages, and caches the prefix up to a
    ``cache_control`` block once it is at least the model's minimum cacheable length (1024
    tokens for Sonnet and Opus). Tools and system are stable and come first; but in agentops
    they are a few hundred tokens, under that minimum, so on their own they never cache. The
    breakpoint that pays is the **moving** one on the last block of the conversation: each turn
    of a tool loop writes its whole prompt, and the next turn, whose prompt starts with exactly
    those blocks, reads them back (the API looks up to 20 blocks behind a breakpoint for a
    cached prefix) and writes only what was added. The caller's messages are not modified: the
    breakpoint is set on a copy, so what is stored and sent next turn stays byte-identical.

    ``prefix_cache_ttl="1h"`` keeps the stable prefix (tools and system) for an hour instead of
    five minutes, for calls that a long wait separates (a write costs twice uncached input
    instead of 1.25 times; a read after the wait costs a tenth). The moving breakpoint keeps the
    5-minute TTL: the turns of a tool loop follow each other within seconds, and the API wants
    longer-lived breakpoints before shorter-lived ones, which this order keeps.
    """
    if prefix_cache_ttl not in ("5m", "1h"):
        raise ValueError(f"prefix_cache_ttl must be '5m' or '1h', not {prefix_cache_ttl!r}")
    prefix = CACHE_CONTROL_1H if prefix_cache_ttl == "1h" else CACHE_CONTROL
    request: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": with_breakpoint(messages)}
    if system:
        request["system"] = [{"type": "text", "text": system, "cache_control": prefix}]
    if tools:
        request["tools"] = [*tools[:-1], {**tools[-1], "cache_control": prefix}]
    return request


# Blocks that cannot carry cache_control; the breakpoint goes on the last block that can.
UNMARKABLE_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``messages`` with a cache breakpoint on the last markable block of the last message."""
    if not messages:
        return messages
    *earlier, last = messages
    content = last.get("content")
    blocks: list[Any] = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if isinstance(block, dict) and block.get("type") not in UNMARKABLE_BLOCKS and (
            block.get("type") != "text" or block.get("text")  # an empty text block cannot be cached
        ):
            blocks[i] = {**block, "cache_control": CACHE_CONTROL}
            return [*earlier, {**last, "content": blocks}]
    return messages


class Metered(anthropic.Middleware):
    """Report each HTTP request of a call to its ``RequestMeter`` (the usage ledger), the one
    ``complete`` set for this thread's call (none: a token count, passed through): before it is
    sent (the meter may refuse it: over budget), and what came of it. The SDK raises connection
    failures here, with no response: a failure to connect means the request never left; any
    other (a read timeout, a connection dropped mid-answer) that it may have reached the API.
    One instance serves every call of a shared client: the meter is not kept on it."""

    def handle(self, request: anthropic.APIRequest, call_next: anthropic.CallNext) -> anthropic.APIResponse[Any]:
        meter = _meter.get()
        if meter is None:
            return call_next(request)
        n = request.retries_taken
        headers = meter.sending(n)
        given = request.options.headers
        request.options.headers = {**(given if isinstance(given, Mapping) else {}), **headers}
        try:
            response = call_next(request)
        except BaseException as exc:
            meter.lost(n, sent=not _never_sent(exc), reason=_failure(exc))
            raise
        meter.answered(n, status=response.status_code, request_id=response.headers.get("request-id", ""),
                       rate=rate_limit_info(response.headers, status=response.status_code))
        return response


# The meter of the model call this thread (context) is making, for Metered.
_meter: contextvars.ContextVar[RequestMeter | None] = contextvars.ContextVar("anthropic_meter", default=None)


def _never_sent(exc: BaseException) -> bool:
    """Whether a failed request surely never reached the server: the connection was not made."""
    cause: BaseException | None = exc
    while cause is not None:
        if type(cause).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _failure(exc: BaseException) -> str:
    cause = exc.__cause__
    return f"{type(exc).__name__}" + (f" ({type(cause).__name__})" if cause is not None else "")


class NoLongInlineRetries(anthropic.Middleware):
    """Let the SDK retry in-process only when the server's retry-after is short.

    ``x-should-retry: false`` is the SDK's own switch for "do not retry this response"; the
    response then surfaces as its typed error and ``_mapped`` stores the retry window.
    """

    def handle(self, request: anthropic.APIRequest, call_next: anthropic.CallNext) -> anthropic.APIResponse[Any]:
        response = call_next(request)
        wait = retry_after_seconds(response.headers) if response.status_code >= 400 else None
        if wait is not None and wait > INLINE_RETRY_WAIT_LIMIT_SECONDS:
            log.info("Anthropic API asked to wait %.0f s; storing a retry window instead of sleeping", wait)
            response.http_response.headers["x-should-retry"] = "false"
        return response


# The rate-limit headers of every answer (https://docs.claude.com/en/api/rate-limits#response-headers),
# by the limiter's dimension.
RATE_LIMIT_HEADERS = {"requests": "anthropic-ratelimit-requests", "input_tokens": "anthropic-ratelimit-input-tokens",
                      "output_tokens": "anthropic-ratelimit-output-tokens"}


def rate_limit_info(headers: Any, *, status: int) -> RateLimitInfo | None:
    """What an answer's ``anthropic-ratelimit-*-limit``, ``-remaining`` and ``-reset`` headers
    say (per minute; the reset an RFC 3339 time), and a 429's retry-after; None when it carries
    none of them (a 429 always says it was one)."""
    limits: dict[str, int] = {}
    remaining: dict[str, int] = {}
    reset_at: dict[str, float] = {}
    for dimension, prefix in RATE_LIMIT_HEADERS.items():
        for suffix, into in (("limit", limits), ("remaining", remaining)):
            raw = headers.get(f"{prefix}-{suffix}")
            if raw and raw.isdigit():
                into[dimension] = int(raw)
        when = _rfc3339(headers.get(f"{prefix}-reset"))
        if when is not None:
            reset_at[dimension] = when
    wait = retry_after_seconds(headers) if status == 429 else None
    if not limits and not remaining and status != 429:
        return None
    return RateLimitInfo(limits=limits, remaining=remaining, retry_after_seconds=wait, reset_at=reset_at,
                         rate_limited=status == 429)


def _rfc3339(raw: str | None) -> float | None:
    """An RFC 3339 time (``2026-12-07T06:00:05Z``, fractions and offsets allowed) in seconds since the epoch."""
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(fields: dict[str, Any], name: str) -> int:
    """A token count of the answer's usage; 0 when it is absent (or not a count)."""
    value = fields.get(name)
    return value if _is_count(value) else 0


def _without_nulls(value: Any) -> Any:
    """A block of the answer as the SDK's ``model_dump(exclude_none=True)`` gives it: no null fields."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def retry_after_seconds(headers: Any) -> float | None:
    """The server's requested wait: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms and _finite(raw_ms):
        return max(0.0, float(raw_ms) / 1000)
    raw = headers.get("retry-after")
    if not raw:
        return None
    if _finite(raw):
        return max(0.0, float(raw))
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return max(0.0, float(email.utils.mktime_tz(parsed) - time.time()))


def _finite(raw: str) -> bool:
    try:
        return math.isfinite(float(raw))
    except ValueError:
        return False
