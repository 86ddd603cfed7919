"""Files that are either whole or absent (written to a temporary name beside the target, then renamed), and the
lock that keeps one process on a folder (a job's output folder, a sweep's folder: `hold_run_lock`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from sweeplab.core.errors import UserError, environment_error


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a temp file beside `path` for binary writing; on success fsync it and rename it over `path`.

    A crash or an exception leaves `path` as it was (absent or the previous version), never half written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp_name, 0o666 & ~current_umask())  # mkstemp makes 0600; a data file should read like any other
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        Path(tmp_name).unlink(missing_ok=True)
        os_error = environment_error(exc)
        if os_error is not None and os_error.filename is None:  # a failed write() names no file: name the target
            raise type(os_error)(os_error.errno, os_error.strerror, str(path)) from exc
        raise
    _fsync_dir(path.parent)


def remove_unfinished_writes(folder: Path) -> list[Path]:
    """Delete what killed `atomic_write`s left in `folder` (their `.<name>.*.tmp` files: never read, never renamed
    into place); the removed paths. Call it only where no write into `folder` can be under way (a job's start)."""
    removed = sorted(Path(folder).glob(".*.tmp")) if Path(folder).is_dir() else []  # atomic_write's temp names
    for stale in removed:
        stale.unlink(missing_ok=True)
    return removed


def current_umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened, which is harmless.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text.encode("utf-8"))


def check_folder_path(directory: str | os.PathLike, what: str) -> None:
    """`directory` is a folder or can become one: neither it nor a folder above it is a file (`mkdir` would raise
    FileExistsError or NotADirectoryError midway). `what`: the option that named it, for the one line."""
    directory = Path(directory)
    for path in (directory, *directory.parents):
        if path.is_dir():
            return
        if path.exists() or path.is_symlink():
            where = "is a file" if path == directory else f"lies under {path}, which is a file"
            raise UserError(f"{what} {directory}: {where}, not a folder; pass a folder")


def check_writable_dir(directory: str | os.PathLike) -> Path:
    """Create `directory` if missing and write (then remove) a probe file in it, so a read-only, foreign or missing
    location fails before work that would write there; the OSError passes through (`errors.is_user_error` names it).

    A full disk is not caught here (an empty file still fits); writes there fail later, with the same one line.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-probe-")
    os.close(fd)
    os.unlink(probe)
    return directory


NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # every file sweeplab opens for writing in a folder others may write


def open_no_follow(path: str | os.PathLike, flags: int, what: str, mode: int = 0o644) -> int:
    """`os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)`: a file sweeplab creates or writes in a shared folder (a lock,
    a record appended to) is never written through a symbolic link planted there (its target would be truncated or
    overwritten). A link in its place: a one-line UserError naming it (`what`: the file's role, for the line)."""
    try:
        return os.open(path, flags | NO_FOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and Path(path).is_symlink()):  # EMLINK: FreeBSD
            raise UserError(f"{path}: is a symbolic link, not {what}; sweeplab never writes through a link in a "
                            "shared folder: remove the link and run again") from None
        raise


def refuse_links(paths: Iterable[str | os.PathLike], writer: str) -> None:
    """Files another program writes without O_NOFOLLOW (Hydra's .hydra/*.yaml and job log, in a folder others may
    write): a symbolic link at any of them is refused in one line before that program runs, as `open_no_follow`
    refuses one where sweeplab writes. `writer`: who would write through it, for the line."""
    for path in paths:
        if Path(path).is_symlink():
            raise UserError(f"{path}: is a symbolic link, and {writer} writes there without checking (its target "
                            "would be overwritten): remove the link and run again")


@contextmanager
def append_no_follow(path: str | os.PathLike, what: str) -> Iterator:
    """A text file opened for appending, never through a link (`open_no_follow`); a failed write (a full disk) is
    raised naming the file, as `atomic_write` does."""
    try:
        with os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what), "a", encoding="utf-8") as f:
            yield f
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:  # a system error of the file's write: name the file
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
        raise  # one built by code (no errno: OSError("...") has only its message) or naming its own file: as it is


BEST_CHECKPOINT_GLOB = "best-step*.ckpt"  # callbacks/checkpoints.BestCheckpoint's names


def best_checkpoint_in(folder: str | os.PathLike) -> Path | None:
    """The best checkpoint of a job's folder (in its checkpoints/ or the folder itself; the newest where a folder
    holds more than one), or None."""
    folder = Path(folder)
    found = [p for place in (folder / "checkpoints", folder) for p in place.glob(BEST_CHECKPOINT_GLOB) if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


LOCK_NAME = ".sweeplab.lock"
LOCK_UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})


@contextlib.contextmanager
def hold_run_lock(directory: Path, what: str, doing: str = "trained") -> Iterator[None]:
    """Hold an exclusive flock on `<directory>/.sweeplab.lock` (`what`: the run, for the message) while the body runs;
    the holder's pid and host are written into the file. Another holder: a one-line UserError naming it. A file
    system that cannot lock: a one-line UserError too (not unguarded training). The kernel releases the lock when
    the process ends, however it ends (a kill -9 leaves the file: `run_lock_is_free` reads it). A holder that ends
    its body removes the file while it still holds it (a finished job's folder keeps no lock file); so a process
    whose lock lands on a file removed meanwhile takes the new file instead (`_lock_the_file_in_place`).
    `doing`: what the holder does to it, for the message ("trained"; a sweep's folder: "run or continued")."""
    path = directory / LOCK_NAME
    directory.mkdir(parents=True, exist_ok=True)
    fd = _lock_the_file_in_place(path, what, doing)
    try:
        with contextlib.suppress(OSError):  # who holds it, for another process's message: a full disk may refuse it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)  # releases the lock


def _lock_the_file_in_place(path: Path, what: str, doing: str) -> int:
    """An open descriptor of `path` with an exclusive flock, the file still at `path` once locked (a holder removes
    its file as it ends: a lock on the removed one would guard nothing)."""
    while True:
        try:
            fd = open_no_follow(path, os.O_RDWR | os.O_CREAT, "a lock file")
        except OSError as exc:  # a directory, a file without permission, a read-only disk in its place
            raise UserError(f"{path}: cannot open the run lock of {what} ({exc.strerror}); remove or fix it, or set "
                            "another hydra.run.dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = f"{what} is being {doing} by another process ({_holder(fd)}, lock {path}); wait for it to end or stop it, then resume"
            os.close(fd)
            raise UserError(message) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in LOCK_UNSUPPORTED:
                raise
            raise UserError(f"{path}: this file system cannot lock files ({os.strerror(exc.errno)}), so a second "
                            "process could train the same run; put the outputs on a local disk (hydra.run.dir=...)") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def run_lock_is_free(directory: Path) -> bool | None:
    """Whether no process holds the run lock of `directory` (hold_run_lock): True, the job that trained there is gone
    (the kernel released its lock, however it ended); False, it still runs; None, this host cannot tell (the folder
    is not here: another host's run)."""
    if not directory.is_dir():
        return None
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | NO_FOLLOW)
    except FileNotFoundError:
        return True  # the lock is taken before a run is opened: a run without one never trained here
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """What the holder wrote into the lock file; it writes right after locking, so a moment may pass."""
    for _ in range(20):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
        time.sleep(0.05)
    return "pid unknown"
