"""Git as the engine runs it on repositories a model may have written (docs/security.md, "Git").

A workspace's ``.git`` is the model's as much as its files are: under bubblewrap it is read-only
to the session's commands, but without bubblewrap, or in a repository an earlier release left,
anything in it may have been written by the model. Git reads programs to run from its
configuration (``core.fsmonitor``, ``filter.<x>.clean``, ``diff.<x>.textconv``, ``core.pager``,
``core.sshCommand``, hooks, ``include.path``, …), and ``replace`` refs, grafts and alternates
change what its objects say. So the engine's git:

- runs with an environment of its own: no system or user configuration, no replace objects,
  no graft file, no terminal prompt, no optional locks, discovery stopped above the repository;
- overrides every setting known to run a program (``OVERRIDES``);
- and, for a repository it owns (``own``), writes ``.git/config`` itself before each command and
  removes the files that redirect or extend the repository (``commondir``, ``info/attributes``,
  ``objects/info/alternates``, ``info/grafts``, ``config.worktree``), so no repository
  configuration the model wrote is ever read. A ``.git`` that is not a plain directory is refused.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from workflows.errors import Permanent

# Settings that would run a program, or that change what the engine reads, set to inert values
# on every command (repository configuration cannot take them back: ``-c`` wins).
OVERRIDES = (
    "core.fsmonitor=false", "core.hooksPath=/dev/null", "core.pager=cat", "core.editor=false",
    "core.askPass=", "core.sshCommand=false", "core.attributesFile=/dev/null", "core.untrackedCache=false",
    "core.excludesFile=/dev/null", "credential.helper=",
    "diff.ignoreSubmodules=all", "status.submoduleSummary=false", "submodule.recurse=false",
    "protocol.allow=never", "protocol.file.allow=always", "gpg.program=false", "commit.gpgsign=false",
    "tag.gpgsign=false", "sequence.editor=false", "gc.auto=0", "maintenance.auto=false",
    "uploadpack.packObjectsHook=", "safe.directory=*", "init.defaultBranch=main", "advice.detachedHead=false",
)
IDENTITY = ("user.name=agentops harness", "user.email=harness@agentops.local")
# What .git/config holds in a repository the engine owns: nothing a model could have added.
OWNED_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
# The engine's ignore rules (.git/info/exclude): bytecode a check or a test run leaves is never
# committed, and never taken for a change to the approved checks.
OWNED_EXCLUDE = "__pycache__/\n*.py[cod]\n"
# Files under .git that point the repository elsewhere or add to what it reads.
REDIRECTS = ("commondir", "config.worktree", "info/attributes", "info/grafts", "objects/info/alternates",
             "objects/info/http-alternates", "shallow")
TIMEOUT_SECONDS = 120


def environment() -> dict[str, str]:
    """The whole environment of the engine's git: nothing of the worker's own besides PATH."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_ATTR_NOSYSTEM": "1", "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_GRAFT_FILE": "/nonexistent/agentops-grafts", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0",
            "GIT_PROTOCOL_FROM_USER": "0", "HOME": "/nonexistent", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def argv(repo: Path | str, *args: str, identity: tuple[str, ...] = IDENTITY) -> list[str]:
    """The command line of one engine git command in ``repo`` (with the overrides and ``identity``)."""
    options = [part for setting in (*OVERRIDES, *identity) for part in ("-c", setting)]
    return ["git", "--no-pager", *options, "-C", str(repo), *args]


def own(repo: Path) -> None:
    """Make ``repo``'s ``.git`` the engine's before a command: its config written by the engine, its
    redirections removed. Does nothing where there is no ``.git`` yet (``init``, ``clone``).

    Raises Permanent when ``.git`` is a symbolic link or a file: a ``gitdir:`` file or a link
    would send the engine's git to a directory the model chose.
    """
    dot_git = repo / ".git"
    if not os.path.lexists(dot_git):
        return
    if not dot_git.is_symlink() and dot_git.is_file():
        main = _worktree_of(dot_git)
        if main is not None:  # a checkout the engine added (git worktree add): own its repository
            own(main)
            return
    if dot_git.is_symlink() or not dot_git.is_dir():
        raise Permanent(f"{dot_git} is not a directory the engine made (a link or a gitdir file): the engine's "
                        "git does not follow it. Restore the workspace from its last approved commit.")
    _write_if_changed(dot_git / "config", OWNED_CONFIG)
    _write_if_changed(dot_git / "info" / "exclude", OWNED_EXCLUDE, keep_extension=True)
    for name in REDIRECTS:
        path = dot_git / name
        if os.path.lexists(path):
            path.unlink()


def _worktree_of(dot_git: Path) -> Path | None:
    """The repository whose linked worktree ``dot_git`` (a ``gitdir:`` file) is, when it names
    ``<repository>/.git/worktrees/<name>`` of a real ``.git`` directory; else None."""
    try:
        text = dot_git.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("gitdir: "):
        return None
    target = Path(text.removeprefix("gitdir: "))
    if not target.is_absolute() or target.parent.name != "worktrees" or target.parent.parent.name != ".git":
        return None
    main_git = target.parent.parent
    if main_git.is_symlink() or not main_git.is_dir() or os.path.realpath(main_git) != str(main_git):
        return None
    return main_git.parent


def _write_if_changed(path: Path, text: str, *, keep_extension: bool = False) -> None:
    """Write ``text`` to ``path`` unless it holds it already (``keep_extension``: it starts with it and
    goes on with anchored directories only, the nested repositories ``exclude_nested`` added)."""
    try:
        current = None if path.is_symlink() else path.read_text()
    except (OSError, UnicodeDecodeError):
        current = None
    if keep_extension and current is not None and current.startswith(text) and all(
            _NESTED.match(line) for line in current[len(text):].splitlines()):
        return
    if current != text:
        if path.parent.is_symlink():
            path.parent.unlink()
        path.parent.mkdir(exist_ok=True)
        replacement = path.with_name(path.name + ".agentops-new")
        replacement.write_text(text)
        os.replace(replacement, path)  # a link in its place is replaced, never followed


_NESTED = re.compile(r"^/[^*?\[\]!#\\]+/$")


def exclude_nested(repo: Path, untracked: list[str]) -> list[str]:
    """Leave the nested repositories among ``untracked`` (``git status`` paths) out of the work: a
    directory with a ``.git`` of its own is never added, committed, cleaned or entered by the
    engine's git (adding one fails, and its configuration is the model's). Returns them."""
    nested = [path for path in untracked
              if path.endswith("/") and os.path.lexists(repo / path / ".git") and _NESTED.match("/" + path)]
    if nested:
        with (repo / ".git" / "info" / "exclude").open("a") as exclude:
            exclude.writelines(f"/{path}\n" for path in nested)
    return nested


def run(repo: Path | str, *args: str, check: bool = True, owned: bool = True,
        identity: tuple[str, ...] = IDENTITY, timeout: float = TIMEOUT_SECONDS) -> str:
    """Run git in ``repo`` as the engine (``owned``: a repository whose ``.git`` the engine owns,
    ``own``); returns its output. Raises Permanent naming the command when it fails (and ``check``)."""
    path = Path(repo)
    env = environment()
    if owned:
        own(path)
        # A workspace without .git yet must not be taken for a part of a repository above it.
        env["GIT_CEILING_DIRECTORIES"] = str(path.resolve().parent)
    try:
        done = subprocess.run(argv(path, *args, identity=identity), capture_output=True, text=True,
                              timeout=timeout, check=False, env=env)
    except FileNotFoundError:
        raise Permanent("git is not installed on this worker; install it (apt-get install git).") from None
    if check and done.returncode != 0:
        raise Permanent(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()[:500]}")
    return done.stdout.rstrip()
