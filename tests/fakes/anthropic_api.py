"""A fake Anthropic Messages API: a real HTTP server on loopback that the real ``anthropic`` SDK talks to.

It is also the documentation of what agentops relies on from the API:

- ``POST /v1/messages`` answers in the real shape: ``id``, ``type: "message"``, ``role``,
  ``content`` blocks (``text``, ``tool_use``), ``model``, ``stop_reason``, ``stop_sequence``,
  ``usage`` (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens`` and its per-TTL breakdown ``cache_creation``), and a
  ``request-id`` header; errors as ``{"type": "error", "error": {"type", "message"}}``.
- **Prompt caching**, as the docs describe it: the prompt is rendered tools → system →
  messages; a ``cache_control`` block (at most 4 per request) marks the end of a prefix
  that is written to the cache when it is at least the model's minimum cacheable length
  (1024 tokens for Sonnet and Opus, 2048 for the Claude 3 Haikus, 4096 for Haiku 4.5 and
  Opus 4.5/4.6); a later request reads the longest cached prefix that ends at a block
  boundary at most 20 blocks before one of its breakpoints. Entries live 5 minutes (or 1 hour
  with ``"ttl": "1h"``) from their last use. Usage then splits the prompt's tokens in three:
  ``cache_read_input_tokens`` (the prefix read), ``cache_creation_input_tokens`` (from there
  to the last breakpoint written) and ``input_tokens`` (the rest, after the last breakpoint).
- Tokens are counted deterministically: 1 token per 4 characters (rounded up) of the JSON
  of each block (keys sorted, ``cache_control`` left out: marking a block does not change it).
- Rate limits (``api.limit = OrganisationLimit(...)``): token buckets of requests, input and output
  tokens per minute, a 429 with ``retry-after`` past them and ``anthropic-ratelimit-*`` headers on
  every answer.
- Faults: 429 ``rate_limit_error`` with ``retry-after``, 529 ``overloaded_error`` (one, a
  run of them, or for a stretch of time), a slow answer, a dropped connection, a 200 whose
  body is not a message.

Each test scripts its answers: ``api.script(answer, …)`` queues answers served in order;
when the queue is empty, ``api.responder(request)`` answers (a function of the request, to
play a model through a whole workflow). Every request and what was answered is kept in
``api.requests``. Time is ``time.time()``, so ``time_machine`` moves the cache's clock too.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300, "1h": 3600}
CHARS_PER_TOKEN = 4


def minimum_cacheable_tokens(model: str) -> int:
    """The shortest prefix the API caches for ``model`` (shorter ones are processed uncached, silently)."""
    if any(name in model for name in ("haiku-4-5", "opus-4-5", "opus-4-6")):
        return 4096
    if "haiku" in model:
        return 2048
    return 1024


def tokens_of(block: Any) -> int:
    """The fake tokenizer: 1 token per 4 characters of the block's JSON, at least 1."""
    return max(1, math.ceil(len(canonical(block)) / CHARS_PER_TOKEN))


def canonical(block: Any) -> str:
    if isinstance(block, dict):
        block = {k: v for k, v in block.items() if k != "cache_control"}
    return json.dumps(block, sort_keys=True, ensure_ascii=False)


# --- what the server can answer --------------------------------------------------------------

@dataclass
class Answer:
    """One scripted answer: a message (``content``, ``stop_reason``) or a fault (``status`` ≠ 200)."""

    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = "end_turn"
    status: int = 200
    error_type: str = ""
    error_message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    drop_connection: bool = False
    raw_body: bytes | None = None
    content_type: str = "application/json"
    stop_details: dict[str, Any] | None = None
    error_details: dict[str, Any] | None = None


def text(value: str, **kwargs: Any) -> Answer:
    return Answer(content=[{"type": "text", "text": value}], **kwargs)


def fenced_json(value: Any, *, preamble: str = "Here is the plan:") -> Answer:
    """JSON in a fenced block with a sentence before it, as Claude often answers."""
    return text(f"{preamble}\n\n```json\n{json.dumps(value, indent=2)}\n```\n")


_tool_ids = itertools.count(1)


def tool_use(name: str, input: dict[str, Any], *, say: str = "") -> Answer:
    block = {"type": "tool_use", "id": f"toolu_fake{next(_tool_ids):06d}", "name": name, "input": input}
    return Answer(content=[*([{"type": "text", "text": say}] if say else []), block], stop_reason="tool_use")


def cut_off(partial: str) -> Answer:
    """An answer stopped by ``max_tokens``: what was generated so far, unfinished."""
    return text(partial, stop_reason="max_tokens")


def refusal(category: str = "cyber", explanation: str = "The request could enable harm.") -> Answer:
    return Answer(content=[], stop_reason="refusal",
                  stop_details={"type": "refusal", "category": category, "explanation": explanation})


def rate_limited(retry_after: float | None = 7) -> Answer:
    return Answer(status=429, error_type="rate_limit_error",
                  error_message="This request would exceed the rate limit for your organization of 50,000 input "
                                "tokens per minute.",
                  headers={"anthropic-ratelimit-input-tokens-limit": "50000",
                           "anthropic-ratelimit-input-tokens-remaining": "0",
                           **({"retry-after": f"{retry_after:g}"} if retry_after is not None else {})})


def overloaded() -> Answer:
    return Answer(status=529, error_type="overloaded_error", error_message="Overloaded")


def api_error(status: int, kind: str, message: str, *, error_code: str | None = None, **headers: str) -> Answer:
    return Answer(status=status, error_type=kind, error_message=message, headers=headers,
                  error_details={"error_code": error_code} if error_code else None)


def slow(seconds: float, then: Answer) -> Answer:
    then.delay_seconds = seconds
    return then


def dropped() -> Answer:
    """The connection closes without a response (a proxy reset, a crashed front end)."""
    return Answer(drop_connection=True)


def raw(body: bytes | dict[str, Any], *, content_type: str = "application/json") -> Answer:
    """A 200 with exactly this body: a truncated or foreign answer (a proxy's HTML page, half a message)."""
    return Answer(raw_body=json.dumps(body).encode() if isinstance(body, dict) else body, content_type=content_type)


# --- the organisation's rate limits -----------------------------------------------------------

RATE_DIMENSIONS = ("requests", "input-tokens", "output-tokens")


class OrganisationLimit:
    """Rate limits like the API's (https://docs.claude.com/en/api/rate-limits): a token bucket per
    dimension, refilled continuously at the minute's limit, that holds ``bucket_seconds`` of it
    (60: a minute's worth; the API may enforce a limit over shorter intervals, 5 holds five
    seconds' worth). A request takes one request, its input tokens as the API counts them
    (uncached input and cache writes; cache reads are free) and its ``max_tokens`` of output,
    given back down to what it wrote when it is answered; it goes when the bucket holds its cost
    (or is full, for one larger than the bucket) and takes all of it. One that does not fit is
    refused with a 429, ``retry-after`` (whole seconds until it would fit) and the
    ``anthropic-ratelimit-*`` headers, which every answer carries (``-reset``: when the bucket is
    full again). A limit of 0 is none."""

    def __init__(self, *, requests_per_minute: int, input_tokens_per_minute: int, output_tokens_per_minute: int = 0,
                 clock: Callable[[], float] = time.time, full: float = 1.0, bucket_seconds: float = 60.0) -> None:
        self.limits = dict(zip(RATE_DIMENSIONS, (requests_per_minute, input_tokens_per_minute,
                                                 output_tokens_per_minute), strict=True))
        self.capacity = {d: v * bucket_seconds / 60 for d, v in self.limits.items()}
        self.clock = clock
        self.levels = {d: full * v for d, v in self.capacity.items()}  # ``full``: the share each bucket starts with
        self.at = clock()
        self.lowest = dict(self.levels)  # the lowest level each bucket reached
        self.low_since: float | None = None  # when a bucket first fell below a tenth of its capacity
        self._lock = threading.Lock()

    def _refill(self) -> float:
        now = self.clock()
        for d, limit in self.limits.items():
            if limit:
                self.levels[d] = min(self.capacity[d], self.levels[d] + limit / 60 * max(0.0, now - self.at))
        self.at = now
        return now

    def take(self, *, input_tokens: int, max_tokens: int) -> tuple[bool, float, dict[str, str]]:
        """(admitted, seconds until it would fit, the answer's rate-limit headers)."""
        with self._lock:
            now = self._refill()
            cost = {"requests": 1, "input-tokens": input_tokens, "output-tokens": max_tokens}
            short = [(min(cost[d], self.capacity[d]) - self.levels[d]) / (limit / 60)
                     for d, limit in self.limits.items() if limit and self.levels[d] < min(cost[d], self.capacity[d])]
            if short:
                return False, max(short), self._headers(now)
            for d, limit in self.limits.items():
                if limit:
                    self.levels[d] -= cost[d]
                    self.lowest[d] = min(self.lowest[d], self.levels[d])
                    if self.levels[d] < self.capacity[d] / 10 and self.low_since is None:
                        self.low_since = now
            return True, 0.0, self._headers(now)

    def give_back(self, *, output_tokens: int) -> None:
        with self._lock:
            self._refill()
            limit = self.limits["output-tokens"]
            if limit:
                self.levels["output-tokens"] = min(self.capacity["output-tokens"],
                                                   self.levels["output-tokens"] + output_tokens)

    def _headers(self, now: float) -> dict[str, str]:
        headers = {}
        for d, limit in self.limits.items():
            if not limit:
                continue
            level = max(0.0, self.levels[d])
            reset = now + (self.capacity[d] - self.levels[d]) / (limit / 60)
            headers |= {f"anthropic-ratelimit-{d}-limit": str(limit),
                        f"anthropic-ratelimit-{d}-remaining": str(int(level)),
                        f"anthropic-ratelimit-{d}-reset": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(reset))}
        return headers


# --- the prompt cache ------------------------------------------------------------------------

@dataclass
class CacheEntry:
    tokens: int
    expires_at: float
    ttl: str


@dataclass(frozen=True)
class CacheUse:
    read: int
    written: int
    written_by_ttl: dict[str, int]
    uncached: int

    @property
    def total(self) -> int:
        return self.read + self.written + self.uncached


class PromptCache:
    """Prefix cache keyed by the model and the exact rendered blocks up to a breakpoint."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.entries: dict[str, CacheEntry] = {}
        self.clock = clock

    def use(self, body: dict[str, Any], *, dry: bool = False) -> CacheUse:
        """What the request reads from and writes to the cache; ``dry``: what it would, changing nothing."""
        model = str(body["model"])
        blocks = rendered_blocks(body)
        ends = list(itertools.accumulate(tokens_of(block) for _, block in blocks))
        keys = self._prefix_keys(model, blocks, body.get("tool_choice"))
        now, minimum = self.clock(), minimum_cacheable_tokens(model)
        breakpoints = [i for i, (_, block) in enumerate(blocks) if _cache_control(block)]
        read = 0
        for b in breakpoints:  # the longest live prefix within the lookback window of any breakpoint
            for j in range(b, max(-1, b - LOOKBACK_BLOCKS - 1), -1):
                entry = self.entries.get(keys[j])
                if entry is not None and entry.expires_at > now:
                    if not dry:
                        entry.expires_at = now + TTL_SECONDS[entry.ttl]  # a read refreshes the entry
                    read = max(read, ends[j])
                    break
        written_by_ttl = {"5m": 0, "1h": 0}
        covered = read
        for b in breakpoints:
            if ends[b] < minimum:
                continue  # too short to cache: silently processed as ordinary input
            ttl = _cache_control(blocks[b][1]).get("ttl", "5m")
            if not dry:
                self.entries[keys[b]] = CacheEntry(tokens=ends[b], expires_at=now + TTL_SECONDS[ttl], ttl=ttl)
            if ends[b] > covered:
                written_by_ttl[ttl] += ends[b] - covered
                covered = ends[b]
        total = ends[-1] if ends else 0
        return CacheUse(read=read, written=covered - read, written_by_ttl=written_by_ttl, uncached=total - covered)

    @staticmethod
    def _prefix_keys(model: str, blocks: list[tuple[str, Any]], tool_choice: Any) -> list[str]:
        """One key per block boundary: a hash of everything up to and including that block.

        ``tool_choice`` is part of the key of message blocks only: changing it keeps the tools
        and system prompt cached but not the conversation, as the docs say."""
        digest = hashlib.sha256(model.encode())
        keys = []
        for section, block in blocks:
            if section == "messages" and tool_choice is not None:
                digest.update(b"tool_choice" + canonical(tool_choice).encode())
                tool_choice = None  # only once, at the first message block
            digest.update(canonical(block).encode() + b"\x00")
            keys.append(digest.copy().hexdigest())
        return keys


def rendered_blocks(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """The prompt in the order the API renders it: tools, then system, then messages' blocks."""
    blocks: list[tuple[str, Any]] = [("tools", tool) for tool in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str) and system:
        blocks.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        blocks += [("system", block) for block in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            blocks.append(("messages", {"role": message.get("role"), "type": "text", "text": content}))
        else:
            blocks += [("messages", {"role": message.get("role"), **block}) for block in content or []]
    return blocks


def _cache_control(block: Any) -> dict[str, Any]:
    control = block.get("cache_control") if isinstance(block, dict) else None
    return control if isinstance(control, dict) else {}


# --- the server ------------------------------------------------------------------------------

@dataclass
class Recorded:
    """One request the server received and what it answered."""

    body: dict[str, Any]
    headers: dict[str, str]
    status: int = 0
    request_id: str = ""
    usage: dict[str, Any] | None = None
    at: float = 0.0
    rate_headers: dict[str, str] = field(default_factory=dict)


class _Server(ThreadingHTTPServer):
    """A listen queue that holds a burst of connections, as the API's does: with the standard
    library's 5, a thousand agents' first calls at once overflow it, and a connection the client
    thinks open is reset under its first request (``ReadError``), which the API never does."""

    request_queue_size = 1024


class FakeAnthropicAPI:
    """The fake API on ``http://127.0.0.1:<port>``; ``start()``/``stop()``, or use the pytest fixture."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.cache = PromptCache(clock)
        self.queue: list[Answer] = []
        self.responder: Callable[[dict[str, Any]], Answer] | None = None
        self.overloaded_until: float | None = None  # answer 529 to every request until this time
        self.overloaded_model: str | None = None  # … only to requests for this model, when set
        self.requests: list[Recorded] = []
        # /v1/messages/count_tokens requests (free, never billed), and faults to answer them with.
        self.counts: list[Recorded] = []
        self.count_faults: list[Answer] = []
        self.unexpected: list[str] = []  # requests that found nothing scripted (the fixture fails the test)
        self.limit: OrganisationLimit | None = None  # the organisation's rate limits; None: unlimited
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # scripting
    def script(self, *answers: Answer) -> FakeAnthropicAPI:
        self.queue.extend(answers)
        return self

    def overload_for(self, seconds: float, *, model: str | None = None) -> None:
        """529 ``overloaded_error`` to every request (or every request for ``model``) for the next
        ``seconds`` (of ``clock``)."""
        self.overloaded_until, self.overloaded_model = self.clock() + seconds, model

    # assertions
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests]

    def answered(self) -> list[Recorded]:
        """The requests answered with a message (status 200)."""
        return [r for r in self.requests if r.status == 200]

    def usage_totals(self) -> dict[str, int]:
        totals = {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 0}
        for recorded in self.answered():
            for key in totals:
                totals[key] += (recorded.usage or {}).get(key, 0)
        return totals

    # lifecycle
    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake API first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeAnthropicAPI:
        self._server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-anthropic-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes slow answers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # answering
    def next_answer(self, body: dict[str, Any]) -> Answer:
        with self._lock:
            if self.overloaded_until is not None and self.clock() < self.overloaded_until and (
                self.overloaded_model in (None, body.get("model"))
            ):
                return overloaded()
            if self.queue:
                return self.queue.pop(0)
        if self.responder is None:
            self.unexpected.append(json.dumps(body)[:300])
            return api_error(500, "api_error", "the fake Anthropic API has nothing scripted for this request")
        return self.responder(body)

    def message_for(self, body: dict[str, Any], answer: Answer, request_id: str) -> dict[str, Any]:
        with self._lock:  # cache lookups and writes are one step, as on the API
            use = self.cache.use(body)
        output = sum(tokens_of(block) for block in answer.content) if answer.content else 1
        usage = {
            "input_tokens": use.uncached, "output_tokens": output,
            "cache_creation_input_tokens": use.written, "cache_read_input_tokens": use.read,
            "cache_creation": {"ephemeral_5m_input_tokens": use.written_by_ttl["5m"],
                               "ephemeral_1h_input_tokens": use.written_by_ttl["1h"]},
            "service_tier": "standard",
        }
        message = {
            "id": f"msg_fake{request_id[-8:]}", "type": "message", "role": "assistant", "model": body["model"],
            "content": answer.content, "stop_reason": answer.stop_reason, "stop_sequence": None, "usage": usage,
        }
        if answer.stop_details is not None:
            message["stop_details"] = answer.stop_details
        return message

    def refusal_of_request(self, body: Any, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """What the real API refuses before any model runs (status, error type, message), or None."""
        if not api_key_of(headers):
            return 401, "authentication_error", "x-api-key header is required"
        if "anthropic-version" not in headers:
            return 400, "invalid_request_error", "anthropic-version: header is required"
        if not isinstance(body, dict):
            return 400, "invalid_request_error", "request body must be a JSON object"
        for name in ("model", "max_tokens", "messages"):
            if name not in body:
                return 400, "invalid_request_error", f"{name}: Field required"
        if not body["messages"]:
            return 400, "invalid_request_error", "messages: at least one message is required"
        ttls = [_cache_control(block).get("ttl", "5m") for _, block in rendered_blocks(body) if _cache_control(block)]
        if len(ttls) > MAX_BREAKPOINTS:
            return 400, "invalid_request_error", (f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                                                  f"provided. Found {len(ttls)}.")
        if any(ttl not in TTL_SECONDS for ttl in ttls):
            return 400, "invalid_request_error", "cache_control.ttl: Input should be '5m' or '1h'"
        if "5m" in ttls and "1h" in ttls[ttls.index("5m"):]:
            return 400, "invalid_request_error", ("a ttl='1h' cache_control block must not come after a ttl='5m' "
                                                  "cache_control block")
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "tool":
            if choice.get("name") not in {t.get("name") for t in body.get("tools") or []}:
                return 400, "invalid_request_error", f"tool_choice names tool {choice.get('name')!r}, not in tools"
        return None


def api_key_of(headers: dict[str, str]) -> str:
    """The key a request carries: ``x-api-key``, or ``authorization: Bearer`` as this SDK sends it."""
    bearer = headers.get("authorization", "")
    return headers.get("x-api-key") or (bearer[len("Bearer "):] if bearer.startswith("Bearer ") else "")


def sse_body(message: dict[str, Any], *, piece: int = 7) -> bytes:
    """``message`` as the Messages API streams it (``"stream": true``): message_start, each content block
    as a start, its text or tool input in pieces of ``piece`` characters, a stop; message_delta (stop
    reason, output tokens), message_stop."""
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 0}}})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            start, whole, delta = {"type": "text", "text": ""}, block["text"], ("text_delta", "text")
        elif block["type"] == "tool_use":
            start, whole, delta = {**block, "input": {}}, json.dumps(block["input"]), ("input_json_delta",
                                                                                      "partial_json")
        else:
            start, whole, delta = block, "", ("", "")
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        for at in range(0, len(whole), piece):
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": delta[0], delta[1]: whole[at:at + piece]}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    output = {"output_tokens": message["usage"]["output_tokens"]}
    events.append(("message_delta", {"type": "message_delta", "usage": output,
                                     "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


def _handler_for(api: FakeAnthropicAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
        # The headers and the body are two writes: without TCP_NODELAY the body waits for the
        # client's delayed ACK of the headers (40 ms a call on Linux), as no real API makes it.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                body: Any = json.loads(raw)
            except json.JSONDecodeError:
                body = None
            request_id = f"req_fake{next(api._ids):010d}"
            recorded = Recorded(body=body if isinstance(body, dict) else {}, headers=headers,
                                request_id=request_id, at=api.clock())
            if self.path.split("?")[0] == "/v1/messages/count_tokens":
                return self._count_tokens(recorded, body, headers)
            with api._lock:
                api.requests.append(recorded)
            if self.path.split("?")[0] != "/v1/messages":
                return self._error(recorded, 404, "not_found_error", f"Not found: {self.path}")
            refused = api.refusal_of_request(body, headers)
            if refused is not None:
                return self._error(recorded, *refused)
            if api.limit is not None:
                with api._lock:
                    use = api.cache.use(body, dry=True)
                fits, wait, recorded.rate_headers = api.limit.take(input_tokens=use.uncached + use.written,
                                                                   max_tokens=int(body["max_tokens"]))
                if not fits:
                    limited = rate_limited(retry_after=math.ceil(wait))
                    return self._error(recorded, 429, limited.error_type, "This request would exceed your "
                                       "organization's rate limit.", {"retry-after": str(math.ceil(wait))})
            answer = api.next_answer(body)
            if answer.delay_seconds and api._stopping.wait(answer.delay_seconds):
                return
            if answer.drop_connection:
                recorded.status = -1
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if answer.raw_body is not None:
                return self._send(recorded, 200, answer.raw_body, {"content-type": answer.content_type})
            if answer.status != 200:
                return self._error(recorded, answer.status, answer.error_type, answer.error_message, answer.headers,
                                   answer.error_details)
            message = api.message_for(body, answer, request_id)
            recorded.usage = message["usage"]
            if api.limit is not None:
                api.limit.give_back(output_tokens=int(body["max_tokens"]) - int(message["usage"]["output_tokens"]))
            if body.get("stream"):
                return self._send(recorded, 200, sse_body(message), {"content-type": "text/event-stream"})
            self._json(recorded, 200, message)

        def _count_tokens(self, recorded: Recorded, body: Any, headers: dict[str, str]) -> None:
            """The free token-counting endpoint: the request's input tokens by the fake tokenizer."""
            with api._lock:
                api.counts.append(recorded)
                fault = api.count_faults.pop(0) if api.count_faults else None
            if not api_key_of(headers):
                return self._error(recorded, 401, "authentication_error", "x-api-key header is required")
            if not isinstance(body, dict) or "model" not in body or not body.get("messages"):
                return self._error(recorded, 400, "invalid_request_error", "model and messages are required")
            if fault is not None:
                return self._error(recorded, fault.status, fault.error_type, fault.error_message, fault.headers)
            total = sum(tokens_of(block) for _, block in rendered_blocks(body))
            self._json(recorded, 200, {"input_tokens": total})

        def _error(self, recorded: Recorded, status: int, kind: str, message: str,
                   headers: dict[str, str] | None = None, details: dict[str, Any] | None = None) -> None:
            error: dict[str, Any] = {"type": kind, "message": message, **({"details": details} if details else {})}
            body = {"type": "error", "error": error, "request_id": recorded.request_id}
            self._json(recorded, status, body, headers)

        def _json(self, recorded: Recorded, status: int, body: dict[str, Any],
                  headers: dict[str, str] | None = None) -> None:
            self._send(recorded, status, json.dumps(body).encode(), {"content-type": "application/json",
                                                                      **(headers or {})})

        def _send(self, recorded: Recorded, status: int, payload: bytes, headers: dict[str, str]) -> None:
            recorded.status = status
            self.send_response(status)
            for name, value in {**recorded.rate_headers, **headers, "request-id": recorded.request_id,
                                "content-length": str(len(payload))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

    return Handler
