"""Labels given at launch: ``key=value`` pairs to find, filter and count workflows by."""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from workflows.errors import InvalidInput

# The document states the same patterns (workflows/api/schemas.py): what it calls valid, the service takes.
LABEL_KEY = r"[a-z][a-z0-9_-]{0,62}"
LABEL_VALUE = r"[A-Za-z0-9._:/@+-]{1,128}"
MAX_LABELS = 16
KEY_RE, VALUE_RE = re.compile(LABEL_KEY), re.compile(LABEL_VALUE)


def labels_checked(labels: Mapping[str, Any] | None, *, what: str = "label") -> dict[str, str]:
    """The labels, each key and value checked; InvalidInput names the first that is wrong.

    A key: 1–63 lowercase letters, digits, _ and -, starting with a letter. A value: 1–128
    letters, digits and . _ - : / @ +. At most MAX_LABELS labels."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidInput(f"Labels must be an object of key to value, e.g. {{\"team\": \"infra\"}}; "
                           f"got {type(labels).__name__}.")
    if len(labels) > MAX_LABELS:
        raise InvalidInput(f"{len(labels)} labels given; a workflow takes at most {MAX_LABELS}. Nothing was launched.")
    checked: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise InvalidInput(f"The {what} key {str(key)[:70]!r} is not 1–63 lowercase letters, digits, _ and -, "
                               "starting with a letter (e.g. team, cost-center).")
        if not isinstance(value, str) or not VALUE_RE.fullmatch(value):
            raise InvalidInput(f"The {what} {key}={str(value)[:130]!r} has a value that is not 1–128 letters, digits "
                               "and . _ - : / @ + (no spaces), e.g. team=infra or ticket=OPS-12.")
        checked[key] = value
    return checked


def label_pairs_parsed(pairs: Iterable[str], *, what: str = "--label") -> dict[str, str]:
    """``["team=infra", "env=prod"]`` as a checked dict: for `--label` and ``?label=``.
    InvalidInput for a pair that is not KEY=VALUE, a key given twice or a bad key or value."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidInput(f"{what} {pair[:140]!r} is not KEY=VALUE, e.g. {what} team=infra.")
        if key in parsed:
            raise InvalidInput(f"{what} {key[:70]} is given twice; a workflow has one value per label key.")
        parsed[key] = value
    return labels_checked(parsed)


def label_filters_parsed(pairs: Iterable[str], *, what: str = "--label") -> list[tuple[str, str]]:
    """``["team=infra", "env=prod"]`` as (key, value) filters that must all hold: a key given twice
    with two values matches nothing, as it says. InvalidInput for a pair that is not KEY=VALUE or a
    bad key or value."""
    filters: list[tuple[str, str]] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidInput(f"{what} {pair[:140]!r} is not KEY=VALUE, e.g. {what} team=infra.")
        labels_checked({key: value})
        if (key, value) not in filters:
            filters.append((key, value))
    if len(filters) > MAX_LABELS:
        raise InvalidInput(f"{len(filters)} label filters given; at most {MAX_LABELS} (a workflow has no more labels).")
    return filters
