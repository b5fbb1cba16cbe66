"""agentops.sandbox.files: the engine's file operations on a workspace, with openat2 and with the
per-component fallback."""
from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from agentops.sandbox import files


@pytest.fixture(params=["openat2", "fallback"])
def opening(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not files.openat2_used():
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(files, "FORCE_FALLBACK", True)

        def never(*args: object) -> int:
            raise AssertionError("openat2 called with the fallback forced")

        monkeypatch.setattr(files, "_openat2", never)
    return str(request.param)


@pytest.fixture
def root(tmp_path: Path, opening: str) -> Path:
    path = (tmp_path / "ws").resolve()
    (path / "src").mkdir(parents=True)
    (path / "src" / "app.py").write_text("print('hi')\n")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("the worker's secret\n")
    return path


def test_a_path_is_relative_without_dots():
    assert files.parts("./src//app.py") == ("src", "app.py")
    assert files.parts(".") == files.parts("") == ()
    with pytest.raises(PermissionError, match="absolute path.*outside the workspace"):
        files.parts("/etc/passwd")
    with pytest.raises(PermissionError, match="'../x' is outside the workspace"):
        files.parts("../x")
    with pytest.raises(PermissionError, match="has a '..' component"):
        files.parts("src/../app.py")


def test_reads_a_regular_file_with_universal_newlines(root):
    (root / "crlf.txt").write_bytes(b"a\r\nb\rc\n")
    assert files.read_text(root, "src/app.py") == "print('hi')\n"
    assert files.read_text(root, "crlf.txt") == "a\nb\nc\n"
    assert files.read_bytes(root, "crlf.txt") == b"a\r\nb\rc\n"


def test_a_read_past_the_bound_is_refused(root):
    (root / "big.txt").write_bytes(b"x" * 101)
    assert files.read_bytes(root, "big.txt", max_bytes=101) == b"x" * 101
    with pytest.raises(ValueError, match="'big.txt' is 101 bytes, over the 100 the file tools read"):
        files.read_bytes(root, "big.txt", max_bytes=100)


@pytest.mark.parametrize("path", ["leak", "out/secret.txt", "src/deep/secret.txt"])
def test_a_link_anywhere_on_the_path_is_refused(root, outside, path):
    (root / "leak").symlink_to(outside / "secret.txt")
    (root / "out").symlink_to(outside)
    (root / "src" / "deep").symlink_to(outside)
    with pytest.raises(PermissionError, match="goes through a symbolic link"):
        files.read_text(root, path)
    with pytest.raises(PermissionError, match="goes through a symbolic link"):
        files.write_text(root, path, "owned")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "the worker's secret\n"


def test_a_link_inside_the_workspace_is_refused_too(root):
    """No link is followed, even one that stays inside: checking where it leads is the race."""
    (root / "alias").symlink_to(root / "src")
    with pytest.raises(PermissionError, match=r"'alias/app.py' goes through a symbolic link \('alias'\)"):
        files.read_text(root, "alias/app.py")


def test_a_fifo_is_refused_at_once_never_opened_blocking(root):
    os.mkfifo(root / "pipe")
    started = time.monotonic()
    with pytest.raises(PermissionError, match="'pipe' is a FIFO, not a regular file"):
        files.read_text(root, "pipe")
    with pytest.raises(PermissionError, match="'pipe' is a FIFO, not a regular file"):
        files.write_text(root, "pipe", "x")
    assert time.monotonic() - started < 1.0
    assert stat.S_ISFIFO(os.lstat(root / "pipe").st_mode)


def test_a_socket_is_refused(root):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock"))
    try:
        with pytest.raises(PermissionError, match="'sock' is a socket, not a regular file"):
            files.read_text(root, "sock")
        with pytest.raises(PermissionError, match="'sock' is a socket, not a regular file"):
            files.write_text(root, "sock", "x")
    finally:
        server.close()


def test_a_device_is_refused_through_a_link_or_as_a_node(root):
    (root / "null").symlink_to("/dev/null")
    with pytest.raises(PermissionError, match="goes through a symbolic link"):
        files.read_text(root, "null")
    try:
        os.mknod(root / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("this worker may not make device nodes")
    with pytest.raises(PermissionError, match="'zero' is a device, not a regular file"):
        files.read_text(root, "zero")
    with pytest.raises(PermissionError, match="'zero' is a device, not a regular file"):
        files.write_text(root, "zero", "x")


def test_a_directory_is_not_read_as_a_file(root):
    with pytest.raises(IsADirectoryError, match="'src' is a directory, not a regular file"):
        files.read_text(root, "src")
    with pytest.raises(IsADirectoryError, match="'src' is a directory"):
        files.write_text(root, "src", "x")
    with pytest.raises(FileNotFoundError, match="'src/absent.py'"):
        files.read_text(root, "src/absent.py")


def test_a_write_makes_parents_and_replaces_the_file_atomically(root):
    app = root / "src" / "app.py"
    app.chmod(0o755)
    inode = app.stat().st_ino
    assert files.write_text(root, "./src//app.py", "print('bye')\n") == "src/app.py"
    assert app.read_text() == "print('bye')\n" and app.stat().st_ino != inode
    assert stat.S_IMODE(app.stat().st_mode) == 0o755
    assert files.write_text(root, "new/deeper/notes.md", "n") == "new/deeper/notes.md"
    assert (root / "new" / "deeper" / "notes.md").read_text() == "n"
    assert sorted(os.listdir(root / "src")) == ["app.py"]  # no temporary left behind


def test_a_failed_write_leaves_the_old_file_and_no_temporary(root, monkeypatch):
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "rename", fail)
    with pytest.raises(OSError, match="No space left on device: 'src/app.py'"):
        files.write_text(root, "src/app.py", "lost")
    assert (root / "src" / "app.py").read_text() == "print('hi')\n"
    assert sorted(os.listdir(root / "src")) == ["app.py"]


def test_a_hard_link_is_never_written_through(root, outside):
    os.link(outside / "secret.txt", root / "linked.txt")
    with pytest.raises(PermissionError, match="'linked.txt' is a hard link to another file"):
        files.write_text(root, "linked.txt", "owned")
    assert (outside / "secret.txt").read_text() == "the worker's secret\n"


def test_a_write_under_a_file_is_refused(root):
    with pytest.raises(NotADirectoryError, match="'src/app.py/x'"):
        files.write_text(root, "src/app.py/x", "x")


def test_a_listing_skips_links_and_skipped_directories(root, outside):
    (root / "out").symlink_to(outside)
    (root / "src" / "leak").symlink_to(outside / "secret.txt")
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "objects" / "ab").write_text("blob")
    (root / "a.txt").write_text("a")
    assert files.list_files(root) == [".git/objects/ab", "a.txt", "src/app.py"]
    assert files.list_files(root, skip={".git"}) == ["a.txt", "src/app.py"]
    assert files.list_files(root, ".git", skip={".git"}) == []
    assert files.list_files(root, "src") == ["src/app.py"]
    assert len(files.list_files(root, limit=2)) == 2
    with pytest.raises(PermissionError, match="goes through a symbolic link"):
        files.list_files(root, "out")


def test_is_file_answers_only_for_a_regular_file_through_no_link(root, outside):
    (root / "leak").symlink_to(outside / "secret.txt")
    os.mkfifo(root / "pipe")
    assert files.is_file(root, "src/app.py")
    assert not any(files.is_file(root, p) for p in ("leak", "pipe", "src", "absent", "../outside/secret.txt", ""))


def test_openat2_is_used_where_the_kernel_has_it(root, opening, monkeypatch):
    calls: list[str] = []
    real = files._openat2

    def counted(dir_fd: int, path: str, flags: int) -> int:
        calls.append(path)
        return real(dir_fd, path, flags)

    if opening == "openat2":
        monkeypatch.setattr(files, "_openat2", counted)
    assert files.read_text(root, "src/app.py") == "print('hi')\n"
    assert calls == (["src/app.py"] if opening == "openat2" else [])
