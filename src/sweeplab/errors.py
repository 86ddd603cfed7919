"""Errors meant for users: one line naming the input, the problem and what is accepted.

Entry points catch `UserError` (and the data layer's `DataFormatError`, a ValueError) and print the message
without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """An expected mistake in a config, a file or the environment; the message is the whole story."""


class ConfigError(UserError):
    def __init__(self, key: str, problem: str):
        self.key = key
        super().__init__(f"config error: {key}: {problem}")


def is_user_error(exc: BaseException) -> bool:
    from sweeplab.data.formats import DataFormatError

    return isinstance(exc, (UserError, DataFormatError, FileNotFoundError))
