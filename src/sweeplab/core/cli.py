"""What every `python -m sweeplab.*` entry point shares for mistakes on its command line: one `error:` line and
exit status 2, never a traceback.

- Hydra's composition errors (an unknown config-group option, an unknown key, a missing `+`) and override syntax
  errors (`model.size=tïny` unquoted, `data.batch_size=[8,16`, a control character) become one line naming the
  override or key and what is accepted: `hydra_error`, used by `compose` (the compose API: bench, profile,
  order_check) and `run_hydra_main` (the `@hydra.main` apps: train, export).
- `ArgumentParser`: argparse's mistakes (an unknown option, a bad value or choice) as one line too, instead of a usage
  block and a line prefixed by the program's name.
- `check_writable`: an output directory that cannot be written (read-only, full, a file in the way) fails before any
  work.

`SWEEPLAB_TRACEBACK=1` adds the full traceback to any expected error (sweeplab.core.errors.exit_on_user_error), for
debugging; the `error:` line stays the last line.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from sweeplab.core.conf_dir import CONF_DIR
from sweeplab.core.errors import ConfigError, UserError, exit_on_user_error

GRAMMAR = "quote a value holding spaces or other special characters: key='value'"
Hint = Callable[[str], "str | None"]


def _shown(text: str) -> str:
    """`text` on one line: control characters (a newline, \\x01) as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def is_hydra_error(exc: BaseException) -> bool:
    """A mistake on the command line that Hydra found: composing the config, or parsing an override."""
    from hydra.errors import ConfigCompositionException, OverrideParseException, SearchPathException

    return isinstance(exc, (ConfigCompositionException, OverrideParseException, SearchPathException))


def _parse_error(exc) -> UserError:
    """`model.size=tïny`: the override, where the parser stopped and why, and how to write such a value."""
    lines = [line for line in str(exc.message).splitlines() if line.strip() and not line.startswith("See https://")]
    first = lines[0] if lines else "cannot parse it"
    if any("missing EQUAL" in line for line in lines):
        first = "not a key=value override (a value with a space is quoted: key='a b')"
    if first.startswith("LexerNoViableAltException: ") and len(lines) > 1 and "^" in lines[1]:
        column = lines[1].index("^") - len("LexerNoViableAltException: ")
        override = str(exc.override)
        where = f"unexpected character {override[column]!r} at position {column + 1}" if 0 <= column < len(override) else "unexpected character"
        first = where
    return UserError(f"override {_shown(str(exc.override))}: {_shown(first)}; {GRAMMAR}")


def hydra_error(exc: BaseException, config_name: str = "train", hint: Hint | None = None) -> UserError:
    """Hydra's exception as sweeplab's one line. `hint(message)`: more to say about a missing config (a family's)."""
    from hydra.errors import OverrideParseException

    error = _parse_error(exc) if isinstance(exc, OverrideParseException) else _composition_error(exc, config_name, hint)
    error.__cause__ = exc  # SWEEPLAB_TRACEBACK=1 shows Hydra's own trace above the line
    return error


def _composition_error(exc: BaseException, config_name: str, hint: Hint | None) -> UserError:
    cause = exc.__cause__
    full_key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if full_key and parent is not None and hasattr(parent, "keys"):  # `model.freze=trunk`: not a key of the group
        key = str(getattr(cause, "key", full_key.rsplit(".", 1)[-1]))
        close = difflib.get_close_matches(key, [str(k) for k in parent.keys()], n=1)
        hint_text = f"did you mean {full_key.rsplit('.', 1)[0] + '.' if '.' in full_key else ''}{close[0]}? " if close else ""
        return ConfigError(full_key, f"unknown key; {hint_text}(`+{full_key}=...` adds a new key)")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if "Available options in" in str(exc):  # `model=textbrige`: name the options
        start = next(i for i, line in enumerate(lines) if line.startswith("Available options in"))
        options = [line for line in lines[start + 1 :] if not line.startswith(("Config search path", "provider="))]
        text += f"; available: {', '.join(options)}"
    if text.startswith("Ambiguous value for argument"):  # `key=a,b` without -m: Hydra's three choices, in a line
        text += "; add -m to sweep (one job per value), or write key=[a,b] for a list, key='a,b' for a string"
    if hint is not None and (more := hint(str(exc))) is not None:
        text += f"; {more}"
    return UserError(f"config error: {_shown(text.removeprefix('In ' + repr(config_name) + ': '))}")


def compose(config_name: str, overrides: list[str], return_hydra_config: bool = False, hint: Hint | None = None):
    """Hydra's compose API over sweeplab's conf/; a mistake in `overrides` raises one-line UserError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
    except Exception as exc:
        if not is_hydra_error(exc):
            raise
        raise hydra_error(exc, config_name, hint) from exc


def run_hydra_main(main: Callable[[], object], config_name: str, hint: Hint | None = None) -> None:
    """Call a `@hydra.main` function; Hydra's own command-line mistakes become one line and exit status 2.

    Hydra prints a composition error as 4 lines and a syntax error as a 40-line traceback (exit 1) unless
    HYDRA_FULL_ERROR lets the exception reach us: it is set here for that (SWEEPLAB_TRACEBACK=1 shows the trace)."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except Exception as exc:
        if not is_hydra_error(exc):
            raise
        exit_on_user_error(hydra_error(exc, config_name, hint))


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its mistakes as one `error:` line (exit status 2) that points at --help."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {_shown(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def check_writable(directory: str | Path, what: str = "output directory") -> Path:
    """Make `directory` (and its parents) now, so that a read-only or full disk fails before any work, in one line
    naming it (UserError). Returns it."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".sweeplab-write-check-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UserError(f"{what} {path}: {exc.strerror or exc}") from None
    return path

