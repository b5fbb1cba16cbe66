"""Every file operation the engine makes on a workspace on a model's behalf (the file tools).

The engine runs outside the sandbox, and a process the model started may change the workspace
while a tool runs: checking a path and then opening it again lets a directory swapped for a
link in between carry the read or write outside. So nothing here checks a path and opens it
again. A path is taken relative to a directory file descriptor the engine holds, one component
at a time: ``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``
where the kernel has it, else ``O_NOFOLLOW`` per component. What the call then reads, writes or
lists is what it opened.

Refused (``PermissionError``): absolute paths, ``..``, a symbolic link anywhere on the path, and
anything but a directory on the way and a regular file at the end (a FIFO, socket or device is
refused without blocking). A write never goes through a file with a second name (a hard link)
and replaces the file atomically (a temporary name in the held directory, then ``rename``).
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import secrets
import stat
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MAX_READ_BYTES = 4_000_000
MAX_LIST_ENTRIES = 100_000  # entries looked at by one listing, files or not

# Tests set this to run the per-component fallback where the kernel has openat2.
FORCE_FALLBACK = False

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (the generic syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


# --- paths -----------------------------------------------------------------------------------

def parts(relative: str) -> tuple[str, ...]:
    """The components of a model's path (``.`` and empty ones dropped), or PermissionError for an
    absolute path or one with ``..``."""
    if relative.startswith("/"):
        raise PermissionError(f"{relative!r} is an absolute path: the file tools take paths relative to the "
                              "workspace and refuse any outside the workspace")
    names = tuple(name for name in relative.split("/") if name not in ("", "."))
    if ".." in names:
        if os.path.normpath(relative).split("/")[0] == "..":
            raise PermissionError(f"{relative!r} is outside the workspace")
        raise PermissionError(f"{relative!r} has a '..' component; name the file relative to the workspace "
                              "without '..'")
    return names


def _refuse_link(relative: str, where: str) -> PermissionError:
    return PermissionError(f"{relative!r} goes through a symbolic link ({where!r}): the file tools follow no "
                           "links, so none can lead outside the workspace")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a directory" if stat.S_ISDIR(mode) else "not a regular file"


def _not_regular(relative: str, mode: int) -> OSError:
    if stat.S_ISDIR(mode):
        return IsADirectoryError(f"{relative!r} is a directory, not a regular file")
    return PermissionError(f"{relative!r} is {_kind(mode)}, not a regular file; the file tools read and write "
                           "regular files only")


# --- opening beneath a held directory --------------------------------------------------------

@contextmanager
def _held(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@functools.cache
def _libc_syscall() -> Any:
    if platform.machine() not in ("x86_64", "aarch64"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall


def _openat2(dir_fd: int, path: str, flags: int) -> int:
    """openat2(2) beneath ``dir_fd`` with no links followed; OSError as os.open raises it."""
    syscall = _libc_syscall()
    if syscall is None:
        raise OSError(errno.ENOSYS, "openat2 is not available")
    how = _OpenHow(flags=flags, mode=0, resolve=_RESOLVE)
    encoded = os.fsencode(path)
    if b"\x00" in encoded:
        raise ValueError("embedded null byte")
    for _ in range(8):  # EAGAIN: a rename raced the lookup; the kernel asks us to try again
        fd = syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(encoded),
                     ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.EINTR):
            raise OSError(code, os.strerror(code), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


@functools.cache
def _kernel_has_openat2() -> bool:
    with _held(os.open("/", _DIR_FLAGS)) as root_fd:
        try:
            os.close(_openat2(root_fd, ".", _DIR_FLAGS))
        except OSError:
            return False  # ENOSYS (an old kernel) or EPERM (a seccomp filter)
    return True


def openat2_used() -> bool:
    """Whether paths are opened with openat2 here (else one component at a time)."""
    return not FORCE_FALLBACK and _kernel_has_openat2()


def _open_beneath(root_fd: int, names: tuple[str, ...], flags: int, relative: str) -> int:
    """Open ``names`` beneath ``root_fd`` following no link; the last with ``flags``."""
    if not names:
        return os.dup(root_fd) if flags & os.O_DIRECTORY else os.open(".", flags, dir_fd=root_fd)
    if openat2_used():
        try:
            return _openat2(root_fd, "/".join(names), flags)
        except OSError as exc:
            link = _first_link(root_fd, names) if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR) else None
            # ELOOP: a link on the way (RESOLVE_NO_SYMLINKS); ENOTDIR: O_DIRECTORY on a final link.
            if exc.errno in (errno.ELOOP, errno.EXDEV) or link is not None:
                raise _refuse_link(relative, link or relative) from None
            raise _refusal_or_named(root_fd, names, exc, relative) from None
    fd = os.dup(root_fd)
    try:
        for at in range(len(names)):
            child = _step(fd, names, at, flags if at == len(names) - 1 else _DIR_FLAGS, relative)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(dir_fd: int, names: tuple[str, ...], at: int, flags: int, relative: str) -> int:
    """Open component ``names[at]`` in ``dir_fd`` with O_NOFOLLOW; a link there is refused."""
    try:
        return os.open(names[at], flags | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP: a link. ENOTDIR on a name that is a directory or a link now: a link, swapped since.
        if exc.errno == errno.ELOOP or exc.errno == errno.ENOTDIR and _link_or_directory(dir_fd, names[at]):
            raise _refuse_link(relative, "/".join(names[:at + 1])) from None
        if at == len(names) - 1:
            raise _refusal_or_named(dir_fd, names[at:], exc, relative) from None
        raise _named(exc, relative) from None


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _link_or_directory(dir_fd: int, name: str) -> bool:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return False
    return stat.S_ISLNK(mode) or stat.S_ISDIR(mode)


def _first_link(root_fd: int, names: tuple[str, ...]) -> str | None:
    """For the refusal's message only: the first link on the path, as it is now."""
    fd = os.dup(root_fd)
    try:
        for at, name in enumerate(names):
            if _is_link(fd, name):
                return "/".join(names[:at + 1])
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = child
        return None
    finally:
        os.close(fd)


def _refusal_or_named(dir_fd: int, names: tuple[str, ...], exc: OSError, relative: str) -> OSError:
    """A socket cannot be opened at all (ENXIO), nor a device on a ``nodev`` mount (EACCES): say
    what it is, as for a FIFO or device that opened."""
    try:
        mode = os.stat("/".join(names), dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return _named(exc, relative)
    special = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
    return _not_regular(relative, mode) if special else _named(exc, relative)


def _named(exc: OSError, relative: str) -> OSError:
    """The same error (OSError picks the subclass from the errno), naming the model's path
    rather than the worker's."""
    code = exc.errno or errno.EIO
    return OSError(code, os.strerror(code), relative)


def _root_fd(root: Path) -> int:
    # The workspace root itself is the engine's path, not the model's.
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


# --- the operations --------------------------------------------------------------------------

def read_bytes(root: Path, relative: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """The bytes of regular file ``relative`` of ``root`` (ValueError past ``max_bytes``)."""
    names = parts(relative)
    with _held(_root_fd(root)) as root_fd, _held(_open_beneath(root_fd, names, _FILE_FLAGS, relative)) as fd:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(relative, info.st_mode)
        if info.st_size > max_bytes:
            raise ValueError(f"{relative!r} is {info.st_size:,} bytes, over the {max_bytes:,} the file tools read")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ValueError(f"{relative!r} is over the {max_bytes:,} bytes the file tools read")
        return b"".join(chunks)


def read_text(root: Path, relative: str, *, max_bytes: int = MAX_READ_BYTES) -> str:
    """Regular file ``relative`` as UTF-8 text with universal newlines (as ``Path.read_text``)."""
    text = read_bytes(root, relative, max_bytes=max_bytes).decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def is_file(root: Path, relative: str) -> bool:
    """Whether ``relative`` names a regular file of ``root`` reached through no link."""
    try:
        names = parts(relative)
        if not names:
            return False
        with _held(_root_fd(root)) as root_fd, _held(_open_beneath(root_fd, names[:-1], _DIR_FLAGS, relative)) as fd:
            return stat.S_ISREG(os.stat(names[-1], dir_fd=fd, follow_symlinks=False).st_mode)
    except (OSError, ValueError):
        return False


def _open_parent(root_fd: int, names: tuple[str, ...], relative: str) -> int:
    """The directory holding ``names[-1]``, made (parents included) where missing."""
    fd = os.dup(root_fd)
    try:
        for at, name in enumerate(names[:-1]):
            try:
                os.mkdir(name, dir_fd=fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise _named(exc, relative) from None
            # Open what is there now, never through a link: made by us or swapped in since.
            child = _step(fd, names, at, _DIR_FLAGS, relative)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_text(root: Path, relative: str, text: str) -> str:
    """Replace (or create, parents included) regular file ``relative`` of ``root`` with ``text`` in
    UTF-8, atomically; returns the path as the file tools name it (``a/b.txt``).

    Refused: a link at the end or on the way, a file with a second name (a hard link made where
    the model could reach a file outside would carry the write there), a FIFO, socket or device.
    The new content goes to a fresh file in the held directory, renamed over the old name: a link
    or second name put there meanwhile is replaced, never written through. The old file's mode
    is kept.
    """
    names = parts(relative)
    if not names:
        raise IsADirectoryError(f"{relative!r} is the workspace itself, not a file")
    data = text.encode("utf-8")
    name = names[-1]
    with _held(_root_fd(root)) as root_fd, _held(_open_parent(root_fd, names, relative)) as parent:
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            mode = None
        else:
            if stat.S_ISLNK(old.st_mode):
                raise _refuse_link(relative, "/".join(names))
            if not stat.S_ISREG(old.st_mode):
                raise _not_regular(relative, old.st_mode)
            if old.st_nlink > 1:
                raise PermissionError(f"{relative!r} is a hard link to another file; write a file of its own instead")
            mode = stat.S_IMODE(old.st_mode)
        _replace(parent, name, data, mode, relative)
    return "/".join(names)


def _replace(parent: int, name: str, data: bytes, mode: int | None, relative: str) -> None:
    temporary = f".agentops-{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                 dir_fd=parent)
    try:
        with _held(fd):
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException as exc:
        try:
            os.unlink(temporary, dir_fd=parent)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, PermissionError):
            raise _named(exc, relative) from None
        raise


def list_files(root: Path, relative: str = ".", *, limit: int = 500, skip: Collection[str] = ()) -> list[str]:
    """Regular files under directory ``relative`` of ``root`` (paths from ``root``), at most ``limit``,
    sorted. Links are skipped, not followed; so are directories named in ``skip`` at any depth."""
    names = parts(relative)
    if any(name in skip for name in names):
        return []
    found: list[str] = []
    seen = 0
    with _held(_root_fd(root)) as root_fd:
        stack = [(_open_beneath(root_fd, names, _DIR_FLAGS, relative), "/".join(names))]
        try:
            while stack and len(found) < limit and seen < MAX_LIST_ENTRIES:
                fd, prefix = stack.pop()
                with _held(fd):
                    with os.scandir(fd) as entries:
                        listed = sorted(entries, key=lambda entry: entry.name, reverse=True)
                    for entry in listed:
                        seen += 1
                        path = f"{prefix}/{entry.name}" if prefix else entry.name
                        if entry.is_file(follow_symlinks=False):
                            found.append(path)
                        elif entry.is_dir(follow_symlinks=False) and entry.name not in skip:
                            try:  # swapped for a link since scandir saw it: skipped, not followed
                                stack.append((os.open(entry.name, _DIR_FLAGS, dir_fd=fd), path))
                            except OSError:
                                continue
        finally:
            for fd, _ in stack:
                os.close(fd)
    return sorted(found[:limit])
