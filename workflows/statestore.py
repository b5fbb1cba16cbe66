"""State that does not grow: large values stored once and referenced, checkpoints of what changed.

A workflow's state is kept in its *stored form*: the state a handler sees, where

- a string of ``AGENTOPS_STATE_BLOB_MIN_CHARS`` characters or more is ``{"$blob": digest, "chars": n}``,
- an element of a long list (the list's JSON over ``AGENTOPS_STATE_ITEM_LIST_MIN_BYTES``) that is an
  object of ``ITEM_MIN_BYTES`` or more is ``{"$item": digest, "bytes": n}``,
- a list of more than ``CHUNK_AFTER`` such elements is a list of ``{"$chunk": digest, "n": k}``, each
  naming ``CHUNK_ITEMS`` consecutive elements stored once as JSON,
- an object that has one of those keys itself is ``{"$lit": object}`` (so no value is misread),

and each digest names a ``StateBlob`` row of the workflow holding the text once (content-addressed:
SHA-256 of the text, the first 32 hex digits). An unchanged value keeps its digest, so a step that
changes one feature of 500 writes one item and one short list of digests, not the board again.

A ``Checkpoint`` holds the delta of the stored state against the previous visit's (``delta``), or
the whole stored state (``delta`` null: every checkpoint written before this module, the first one
of a workflow, and one whenever the deltas since the last whole one add up to twice its size, so
reading any visit's state costs at most three times the state). ``state_hash`` is the hash of the
stored state the checkpoint leads to; a row changed behind the engine's back (a data migration of
parked state) no longer matches it, and the next checkpoint is a whole one again.

Nothing here locks or rings: ``services.visits.enter_node`` writes through ``state_write``, the
engine reads through ``state_of``, replay and the admin through ``states_by_visit``.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from workflows.errors import InvalidInput

BLOB = "$blob"  # a long string, stored once
ITEM = "$item"  # an element of a long list, stored once as JSON
CHUNK = "$chunk"  # CHUNK_ITEMS consecutive elements of a very long list, stored once as JSON
LIT = "$lit"  # an object that has one of these keys itself
MARKERS = frozenset({BLOB, ITEM, CHUNK, LIT})
ITEM_MIN_BYTES = 256
# A list of more than CHUNK_AFTER elements is kept as references to chunks of CHUNK_ITEMS: a step
# that changes one of 500 features rewrites one chunk and a list of 16 references, not 500.
CHUNK_AFTER = 64
CHUNK_ITEMS = 32
MAX_JSON_BYTES = 1_000_000  # one JSON value the engine stores (json_checked)
MAX_VALUE_CHARS = 1_000_000  # one stored value (a string, or one list element's JSON), as MAX_JSON_BYTES
FULL_EVERY = 2  # a whole checkpoint when the deltas since the last one reach this many times its size

# delta operations (JSON): {"=": value} replaces; {"{}": {key: op}, "-": [keys]} patches an object;
# {"[]": {index: op}, "n": length} patches a list of that new length.
SET, OBJ, DROP, LIST, LEN = "=", "{}", "-", "[]", "n"


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def canonical(value: Any) -> str:
    """The JSON text hashed and measured: sorted keys (PostgreSQL's jsonb reorders them), no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def state_hash(stored: Any) -> str:
    return digest_of(canonical(stored))


@dataclass
class Externalized:
    """A value in stored form and the blobs (digest: text) it references that are new to this call."""

    value: Any
    blobs: dict[str, str] = field(default_factory=dict)


def externalize(value: Any, *, what: str) -> Externalized:
    """``value`` in stored form; raises InvalidInput naming ``what`` when one value is over the limit."""
    out = Externalized(None)
    out.value = _ext(value, out.blobs, what)
    return out


def _ext(value: Any, blobs: dict[str, str], what: str) -> Any:
    if isinstance(value, str):
        if len(value) < settings.AGENTOPS_STATE_BLOB_MIN_CHARS:
            return value
        _check_size(len(value), what)
        digest = digest_of(value)
        blobs[digest] = value
        return {BLOB: digest, "chars": len(value)}
    if isinstance(value, dict):
        inner = {k: _ext(v, blobs, what) for k, v in value.items()}
        return {LIT: inner} if MARKERS & inner.keys() else inner
    if isinstance(value, list | tuple):
        items = [_ext(v, blobs, what) for v in value]
        if len(items) < 2 or len(canonical(items)) < settings.AGENTOPS_STATE_ITEM_LIST_MIN_BYTES:
            return items
        items = [_item(v, blobs, what) for v in items]
        if len(items) <= CHUNK_AFTER:
            return items
        return [_chunk(items[i:i + CHUNK_ITEMS], blobs, what) for i in range(0, len(items), CHUNK_ITEMS)]
    return value


def _chunk(items: list[Any], blobs: dict[str, str], what: str) -> dict[str, Any]:
    text = canonical(items)
    _check_size(len(text), what)
    digest = digest_of(text)
    blobs[digest] = text
    return {CHUNK: digest, "n": len(items)}


def externalize_checked(value: Any, *, what: str) -> Externalized:
    """``externalize``, then the checks of ``json_checked`` on the stored form (JSON, at most 1 MB)
    and on each blob's text (no NUL, no lone surrogates); raises InvalidInput naming ``what``."""
    out = externalize(value, what=what)
    json_checked(out.value, what=what)
    for text in out.blobs.values():
        _text_checked(text, what)
    return out


def _text_checked(text: str, what: str) -> None:
    if "\x00" in text:
        raise InvalidInput(f"{what} contains a NUL character, which PostgreSQL cannot store.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} contains characters that are not valid Unicode (lone surrogates), which "
                           "PostgreSQL cannot store.") from None


def _item(value: Any, blobs: dict[str, str], what: str) -> Any:
    if not isinstance(value, dict):
        return value
    text = canonical(value)
    if len(text) < ITEM_MIN_BYTES:
        return value
    _check_size(len(text), what)
    digest = digest_of(text)
    blobs[digest] = text
    return {ITEM: digest, "bytes": len(text)}


def _check_size(size: int, what: str) -> None:
    if size > MAX_VALUE_CHARS:
        raise InvalidInput(f"{what} holds one value of {size} characters; the limit for one value is "
                           f"{MAX_VALUE_CHARS}. Store less of it (a tail, a summary) or keep it outside the workflow "
                           "(a file of the workspace) and store its name.")


def references(value: Any) -> dict[str, str]:
    """The digests ``value`` (stored form) references directly, each with its kind (BLOB or ITEM)."""
    found: dict[str, str] = {}
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if len(v) == 2 and isinstance(v.get(BLOB), str):
                found[v[BLOB]] = BLOB
            elif len(v) == 2 and isinstance(v.get(ITEM), str):
                found[v[ITEM]] = ITEM
            elif len(v) == 2 and isinstance(v.get(CHUNK), str):
                found[v[CHUNK]] = CHUNK
            elif len(v) == 1 and isinstance(v.get(LIT), dict):
                stack.extend(v[LIT].values())
            else:
                stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return found


def internalize(value: Any, blobs: dict[str, str]) -> Any:
    """``value`` as handlers see it: references replaced by what they name (``blobs``: digest → text)."""
    if isinstance(value, dict):
        if len(value) == 2 and isinstance(value.get(BLOB), str):
            return blobs[value[BLOB]]
        if len(value) == 2 and isinstance(value.get(ITEM), str):
            return internalize(json.loads(blobs[value[ITEM]]), blobs)
        if len(value) == 1 and isinstance(value.get(LIT), dict):
            return {k: internalize(v, blobs) for k, v in value[LIT].items()}
        return {k: internalize(v, blobs) for k, v in value.items()}
    if isinstance(value, list):
        out: list[Any] = []
        for v in value:
            if isinstance(v, dict) and len(v) == 2 and isinstance(v.get(CHUNK), str):
                out.extend(internalize(json.loads(blobs[v[CHUNK]]), blobs))
            else:
                out.append(internalize(v, blobs))
        return out
    return value


# --- deltas -----------------------------------------------------------------------------------

def diff(old: Any, new: Any) -> Any:
    """The operation that turns ``old`` into ``new`` (both JSON), or None when they are equal."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        ops = {k: op for k, v in new.items() if (op := diff(old.get(k, _ABSENT), v)) is not None}
        dropped = [k for k in old if k not in new]
        patch: dict[str, Any] = {OBJ: ops, **({DROP: dropped} if dropped else {})}
        return _smaller(patch, new)
    if isinstance(old, list) and isinstance(new, list):
        ops = {str(i): op for i, v in enumerate(new)
               if (op := diff(old[i] if i < len(old) else _ABSENT, v)) is not None}
        return _smaller({LIST: ops, LEN: len(new)}, new)
    return {SET: new}


class _Absent:
    def __eq__(self, other: object) -> bool:
        return other is self

    __hash__ = object.__hash__


_ABSENT = _Absent()


def _smaller(patch: dict[str, Any], new: Any) -> dict[str, Any]:
    return patch if len(canonical(patch)) < len(canonical(new)) + 8 else {SET: new}


def apply(old: Any, op: Any) -> Any:
    """``old`` with the operation ``diff`` returned applied."""
    if op is None:
        return old
    if SET in op:
        return op[SET]
    if OBJ in op:
        base = dict(old) if isinstance(old, dict) else {}
        for k in op.get(DROP, []):
            base.pop(k, None)
        for k, sub in op[OBJ].items():
            base[k] = apply(base.get(k), sub)
        return base
    base_list = list(old) if isinstance(old, list) else []
    n = int(op[LEN])
    out = base_list[:n] + [None] * max(0, n - len(base_list))
    for i, sub in op[LIST].items():
        out[int(i)] = apply(out[int(i)], sub)
    return out


# --- blobs: writes, and reads through a small cache of immutable rows ------------------------

class _BlobCache:
    """Blob texts by (workflow, digest): immutable, so a process may keep them (bounded by characters)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self.texts: OrderedDict[tuple[int, str], str] = OrderedDict()

    def get(self, key: tuple[int, str]) -> str | None:
        text = self.texts.get(key)
        if text is not None:
            self.texts.move_to_end(key)
        return text

    def put(self, key: tuple[int, str], text: str) -> None:
        if key in self.texts or len(text) > self.max_chars // 4:
            return
        self.texts[key] = text
        self.chars += len(text)
        while self.chars > self.max_chars:
            _, dropped = self.texts.popitem(last=False)
            self.chars -= len(dropped)


_cache = _BlobCache(max_chars=32_000_000)


def blobs_store(workflow_id: int, blobs: dict[str, str], *, node_visit: int, now: Any) -> None:
    """Insert the blobs not stored yet. Idempotent: unique constraint ``uniq_state_blob`` (workflow,
    digest), conflicting inserts ignored: the same text has the same digest."""
    from workflows.models import StateBlob

    if not blobs:
        return
    known = set(StateBlob.objects.filter(workflow_id=workflow_id, digest__in=list(blobs)).values_list(
        "digest", flat=True))
    StateBlob.objects.bulk_create(
        [StateBlob(workflow_id=workflow_id, digest=d, data=text, chars=len(text), node_visit=node_visit,
                   created_at=now) for d, text in blobs.items() if d not in known],
        ignore_conflicts=True)
    for d, text in blobs.items():
        _cache.put((workflow_id, d), text)


def blobs_load(workflow_id: int, value: Any, known: dict[str, str] | None = None) -> dict[str, str]:
    """Every blob ``value`` (stored form) references, items' own references included."""
    from workflows.models import StateBlob

    texts: dict[str, str] = dict(known or {})
    refs = references(value)
    wanted = {d: kind for d, kind in refs.items() if d not in texts}
    while wanted:
        missing = []
        for d in wanted:
            text = _cache.get((workflow_id, d))
            if text is None:
                missing.append(d)
            else:
                texts[d] = text
        if missing:
            for d, text in StateBlob.objects.filter(workflow_id=workflow_id, digest__in=missing).values_list(
                    "digest", "data"):
                texts[d] = text
                _cache.put((workflow_id, d), text)
        lost = [d for d in wanted if d not in texts]
        if lost:
            raise InvalidInput(f"Workflow {workflow_id}'s state references blob {lost[0]}, which is not stored; "
                               "restore it from a backup (or an export of its history) before resuming it.")
        nested: dict[str, str] = {}
        for d, kind in wanted.items():
            if kind in (ITEM, CHUNK):  # an item's or a chunk's JSON references values of its own
                nested.update(references(json.loads(texts[d])))
        wanted = {d: kind for d, kind in nested.items() if d not in texts}
    return texts


def blobs_referenced(workflow_id: int, values: Iterable[Any], *, per_fetch: int = 500) -> set[str]:
    """The digests of the workflow's blobs that ``values`` (stored form, read one at a time)
    reference, directly or through the items and chunks they reference; holds digests only."""
    from workflows.models import StateBlob

    found: set[str] = set()
    nested: set[str] = set()

    def add(value: Any) -> None:
        for d, kind in references(value).items():
            if d not in found:
                found.add(d)
                if kind in (ITEM, CHUNK):  # its JSON references values of its own
                    nested.add(d)

    for value in values:
        add(value)
    while nested:
        wanted, nested = sorted(nested), set()
        for i in range(0, len(wanted), per_fetch):
            for text in StateBlob.objects.filter(workflow_id=workflow_id, digest__in=wanted[i:i + per_fetch]
                                                 ).values_list("data", flat=True).iterator(chunk_size=per_fetch):
                add(json.loads(text))
    return found


def resolve(workflow_id: int, value: Any) -> Any:
    """``value`` (stored form, of this workflow) as handlers see it."""
    if not references(value):
        return internalize(value, {})
    return internalize(value, blobs_load(workflow_id, value))


# --- the workflow's state ---------------------------------------------------------------------

_RESOLVED = "_agentops_resolved_state"


def state_of(workflow: Any) -> dict[str, Any]:
    """The workflow's current state as handlers see it (its row holds the stored form); kept on the
    instance until the state is written again."""
    cached = getattr(workflow, _RESOLVED, None)
    if cached is not None and cached[0] is workflow.state:
        return dict(cached[1])
    stored = workflow.state if isinstance(workflow.state, dict) else {}
    resolved = resolve(workflow.pk, stored)
    setattr(workflow, _RESOLVED, (workflow.state, resolved))
    return dict(resolved)


@dataclass(frozen=True)
class Written:
    """What ``state_write`` decided: the checkpoint's delta (None: a whole one), and its bookkeeping."""

    delta: Any
    state_hash: str
    chain_bytes: int


def state_write(workflow: Any, updates: dict[str, Any], *, previous: tuple[str, int] | None, what: str,
                now: Any) -> Written:
    """Merge ``updates`` (as handlers wrote them) into the workflow's state: the row gets the stored
    form, new blobs are stored, and the caller's checkpoint gets the returned delta against
    ``previous`` (the ``state_hash`` and ``chain_bytes`` of the workflow's last checkpoint, or
    None), or the whole state."""
    resolved = state_of(workflow)
    ext = externalize_checked(updates, what=what)
    old_stored = workflow.state if isinstance(workflow.state, dict) else {}
    new_stored = json_checked({**old_stored, **ext.value}, what=what)
    blobs_store(workflow.pk, ext.blobs, node_visit=workflow.node_visit + 1, now=now)
    new_hash = state_hash(new_stored)
    delta = None
    chain = 0
    if previous is not None and previous[0] and previous[0] == state_hash(old_stored):
        op = diff(old_stored, new_stored)
        delta = op if op is not None else {OBJ: {}}
        chain = previous[1] + len(canonical(delta))
        if chain >= FULL_EVERY * len(canonical(new_stored)):
            delta, chain = None, 0
    workflow.state = new_stored
    resolved.update(updates)
    setattr(workflow, _RESOLVED, (new_stored, resolved))
    return Written(delta=delta, state_hash=new_hash, chain_bytes=chain)


def stored_states(checkpoints: Iterable[Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """(checkpoint, stored state it leads to), in the order given (ascending visits, from a whole one)."""
    state: dict[str, Any] = {}
    for checkpoint in checkpoints:
        if checkpoint.delta is None:
            state = checkpoint.state if isinstance(checkpoint.state, dict) else {}
        else:
            state = apply(state, checkpoint.delta)
        yield checkpoint, state


def checkpoints_from(workflow: Any, first_visit: int) -> Any:
    """The workflow's checkpoints from the last whole one at or before ``first_visit`` on."""
    from workflows.models import Checkpoint

    rows = Checkpoint.objects.filter(workflow=workflow)
    base = rows.filter(node_visit__lte=first_visit, delta__isnull=True).order_by("-node_visit").values_list(
        "node_visit", flat=True).first()
    return rows.filter(node_visit__gte=base if base is not None else 0).order_by("node_visit")


def states_by_visit(workflow: Any, *, first_visit: int = 1,
                    last_visit: int | None = None) -> dict[int, tuple[Any, dict[str, Any]]]:
    """Checkpoint and resolved state of each visit in [first_visit, last_visit] that has a checkpoint."""
    out: dict[int, tuple[Any, dict[str, Any]]] = {}
    blobs: dict[str, str] = {}
    for checkpoint, stored in stored_states(checkpoints_from(workflow, first_visit)):
        if checkpoint.node_visit < first_visit:
            continue
        if last_visit is not None and checkpoint.node_visit > last_visit:
            break
        blobs = blobs_load(workflow.pk, stored, blobs)
        out[checkpoint.node_visit] = (checkpoint, internalize(stored, blobs))
    return out


def states_streamed(workflow: Any, *, first_visit: int = 1,
                    chunk_size: int = 8) -> Iterator[tuple[Any, dict[str, Any]]]:
    """(checkpoint, resolved state) of each visit from ``first_visit`` on, read by a cursor: memory
    holds one fetch of checkpoints and the blobs of one state, however long the run."""
    rows = checkpoints_from(workflow, first_visit).iterator(chunk_size=chunk_size)
    for checkpoint, stored in stored_states(rows):
        if checkpoint.node_visit >= first_visit:
            yield checkpoint, internalize(stored, blobs_load(workflow.pk, stored))


def state_at(workflow: Any, visit: int) -> dict[str, Any]:
    """The resolved state the workflow entered ``visit`` with ({} when that visit has no checkpoint)."""
    found = states_by_visit(workflow, first_visit=visit, last_visit=visit).get(visit)
    return found[1] if found is not None else {}


def stored_sizes(workflow_id: int) -> Iterator[tuple[int, int, int]]:
    """(visit, bytes of its checkpoint row's JSON, bytes of the stored state the row held on entering it)."""
    from workflows.models import Checkpoint

    for checkpoint, stored in stored_states(Checkpoint.objects.filter(workflow_id=workflow_id).order_by("node_visit")):
        own = checkpoint.state if checkpoint.delta is None else checkpoint.delta
        yield checkpoint.node_visit, len(canonical(own).encode()), len(canonical(stored).encode())


def json_checked(value: Any, *, what: str) -> Any:
    """Return ``value`` if it is JSON-serializable, free of NUL characters and under 1 MB."""
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serializable: {exc}.") from None
    if len(encoded) > MAX_JSON_BYTES:
        raise InvalidInput(f"{what} is {len(encoded)} bytes of JSON; the limit is {MAX_JSON_BYTES}.")
    if "\\u0000" in encoded:
        raise InvalidInput(f"{what} contains a NUL character, which PostgreSQL cannot store.")
    if "\\ud" in encoded:  # a surrogate escape: fine in pairs, rejected by PostgreSQL when alone
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(
                f"{what} contains characters that are not valid Unicode (lone surrogates), "
                "which PostgreSQL cannot store."
            ) from None
    return value
