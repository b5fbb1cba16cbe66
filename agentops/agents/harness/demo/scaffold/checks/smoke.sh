#!/bin/sh
# Smoke check: the app starts, adds a task and lists it.
set -e
export TODO_DB="${TMPDIR:-/tmp}/smoke-$$.json"
python todo.py add "Smoke test" >/dev/null
python todo.py list | grep -q "Smoke test"
rm -f "$TODO_DB"
