"""Errors meant for users: one line naming the input, the problem and what is accepted.

Entry points catch `UserError` (and the data layer's `DataFormatError`, a ValueError) and print the message
without a traceback; anything else is a bug and keeps its traceback. `is_user_error` is the one place that decides
what is expected: besides those, a file system that is full, read-only or not ours to write (anywhere in the
exception's chain: torch.save, for one, reports a full disk as a RuntimeError whose context is the OSError).
"""

from __future__ import annotations

import errno
import io
import os
import sys
import traceback
from collections.abc import Iterator
from typing import NoReturn

from sweeplab.core.channels import TRACEBACK_ENV


class UserError(ValueError):
    """An expected mistake in a config, a file or the environment; the message is the whole story."""


class DataFormatError(ValueError):
    """A malformed or missing data file. The message is one line: "<path>:<line N | record N>: <what is wrong>"."""


class ConfigError(UserError):
    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"config error: {key}: {problem}")


# the environment's answer, not a bug: the user can free space, pick a writable directory or fix permissions
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT})


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then what it was raised from (its cause, else its context), and so on; each exception once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


# sqlite's answers that are the disk's (SQLITE_FULL, SQLITE_READONLY), not a bug: raised as its own OperationalError
# (through SQLAlchemy and MLflow), which names neither the file nor an errno
SQLITE_ENVIRONMENT = {"database or disk is full": errno.ENOSPC, "attempt to write a readonly database": errno.EROFS}
_sqlite_store: list[str] = []  # the sqlite file this process's runs are written to (tracking.mlflow_store notes it)


def note_sqlite_store(path: str | os.PathLike) -> None:
    """The sqlite file of the MLflow store in use: a full or read-only disk under it is named with this path."""
    _sqlite_store[:] = [str(path)]


def environment_error(exc: BaseException) -> OSError | None:
    """The OSError with one of ENVIRONMENT_ERRNOS that `exc` is or was raised from (its cause/context chain); sqlite's
    full or read-only database as that OSError, naming the store's file."""
    for e in exception_chain(exc):
        if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
            return e
        if type(e).__name__ == "OperationalError" and type(e).__module__.startswith("sqlite3"):
            code = next((n for text, n in SQLITE_ENVIRONMENT.items() if text in str(e)), None)
            if code is not None:
                return OSError(code, f"{os.strerror(code)} (the MLflow store's sqlite database)",
                               _sqlite_store[0] if _sqlite_store else "the MLflow store")
    return None


def is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, (UserError, DataFormatError, FileNotFoundError)) or environment_error(exc) is not None


def user_message(exc: BaseException) -> str:
    """The one line an expected error prints: its message, or for the file system the path and the OS's reason."""
    if isinstance(exc, (UserError, FileNotFoundError)) or (os_error := environment_error(exc)) is None:
        return str(exc)
    where = " -> ".join(str(name) for name in (os_error.filename, os_error.filename2) if name is not None)
    return f"{where or file_being_written(os_error, exc) or 'writing a file'}: " \
           f"{os_error.strerror or errno.errorcode.get(os_error.errno, '?')}"


def file_being_written(*raised: BaseException) -> str | None:
    """The file a failed write was writing, where its OSError names none: a write or flush of an open file (Hydra's
    .hydra/*.yaml, a library's `f.write`) raises ENOSPC with no filename. Read from the failing frames' locals, the
    innermost first: the first file object open for writing that has a path."""
    for exc in (e for first in raised for e in exception_chain(first)):
        for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
            for value in list(frame.f_locals.values()):
                mode, name = getattr(value, "mode", None), getattr(value, "name", None)
                if (isinstance(value, io.IOBase) and isinstance(mode, str) and set(mode) & set("wax+")
                        and isinstance(name, (str, bytes)) and name):
                    return os.fsdecode(name)
    return None


def report_user_error(exc: BaseException) -> int:
    """For entry points' `except` clauses: a user error becomes one `error:` line on stderr and the exit status 2
    (returned); anything else is re-raised with its traceback. SWEEPLAB_TRACEBACK=1 prints a user error's too."""
    if not is_user_error(exc):
        raise exc
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        traceback.print_exception(exc)
    print(f"error: {user_message(exc)}", file=sys.stderr)
    return 2


def exit_on_user_error(exc: BaseException) -> NoReturn:
    """`report_user_error`, then exit with its status."""
    sys.exit(report_user_error(exc))
