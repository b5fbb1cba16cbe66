"""Helpers for the checks: run todo.py as a user would, in a fresh temporary directory."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Todo:
    """A user with an empty task list of their own."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="todo-check-")
        self.db = os.path.join(self.dir, "todo.json")

    def run(self, *args, today=None):
        env = dict(os.environ, TODO_DB=self.db)
        if today:
            env["TODO_TODAY"] = today
        done = subprocess.run([sys.executable, os.path.join(ROOT, "todo.py"), *args], capture_output=True,
                              text=True, env=env, cwd=self.dir, timeout=20)
        print(f"$ todo {' '.join(args)}  -> exit {done.returncode}\n{done.stdout}{done.stderr}", end="")
        return done.returncode, done.stdout, done.stderr


def expect(condition, message):
    if not condition:
        print(f"FAIL: {message}")
        sys.exit(1)


def passed(feature):
    print(f"PASS {feature}")
