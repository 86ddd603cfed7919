"""Errors meant for users: one line naming the input, the problem and what is accepted.

Entry points catch `UserError` (and the data layer's `DataFormatError`, a ValueError) and print the message
without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(ValueError):
    """An expected mistake in a config, a file or the environment; the message is the whole story."""


class ConfigError(UserError):
    def __init__(self, key: str, problem: str):
        self.key = key
        super().__init__(f"config error: {key}: {problem}")


def is_user_error(exc: BaseException) -> bool:
    from sweeplab.data.formats import DataFormatError

    return isinstance(exc, (UserError, DataFormatError, FileNotFoundError))


def exit_on_user_error(exc: BaseException) -> NoReturn:
    """For entry points' `except` clauses: a user error becomes one `error:` line on stderr and exit status 2;
    anything else is re-raised with its traceback."""
    if not is_user_error(exc):
        raise exc
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
