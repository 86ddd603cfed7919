"""The Optuna search's journal (`optuna_journal.log` in the sweep folder), read and checked before anything is written.

Optuna's JournalStorage appends one JSON line per change. A kill -9 or a full disk in the middle of an append leaves a
torn last line (no newline at its end); Optuna then appends the next record onto it, and every later read fails with
a JSONDecodeError. So before a search opens its journal, `check_journal` reads every line: a torn last line is dropped
with a warning (the records before it, every finished trial, are whole), a last record that only lost its newline gets
it back, and anything else (a line that is no JSON record, bytes that are no text, a file of that name that is no
journal, a link) is one line naming the file and the line.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sweeplab.core.errors import UserError
from sweeplab.core.files import append_no_follow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldStudy:
    """A study the journal holds: its trials so far and its direction ("maximize" | "minimize")."""

    trials: int
    direction: str


def check_journal(path: Path) -> None:
    """Read `path` whole and check that every line is a journal record; mend a torn end (see the module's note)."""
    if path.is_symlink():
        raise UserError(f"{path}: is a symbolic link, not an Optuna journal; sweeplab never writes through a link in a "
                        "shared folder: remove the link and run again")
    if not path.exists():
        return
    if not path.is_file():
        raise UserError(f"{path}: is not a regular file, so not an Optuna journal: move it away or give a new "
                        "hydra.sweep.dir")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the Optuna journal ({exc.strerror})") from None
    lines = data.split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline
    for number, line in enumerate(lines, start=1):
        if _record(line) is None:
            raise UserError(f"{path}, line {number}: not an Optuna journal record ({_why(line)}); the file is damaged "
                            "or no journal: move it away (or restore it) or give a new hydra.sweep.dir")
    if not last:
        return
    if _record(last) is not None:  # whole, only its newline missing: Optuna would append onto it
        with append_no_follow(path, "an Optuna journal") as journal:
            journal.write("\n")
        return
    if not lines:
        raise UserError(f"{path}, line 1: not an Optuna journal record ({_why(last)}); the file is damaged or no "
                        "journal: move it away or give a new hydra.sweep.dir")
    kept = len(data) - len(last)
    with open(path, "r+b") as journal:  # path is no link (checked above)
        journal.truncate(kept)
        journal.flush()
        os.fsync(journal.fileno())
    log.warning("%s: dropped its torn last line (line %d, %d bytes, what a kill or a full disk in the middle of a "
                "write leaves); the %d records before it are whole", path, len(lines) + 1, len(last), len(lines))


def held_studies(path: Path) -> dict[str, HeldStudy]:
    """{study name: HeldStudy} of the journal at `path` (checked first: `check_journal`), read without writing to
    it; {} when there is none."""
    check_journal(path)
    if not path.is_file():
        return {}
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(path)))
    return {s.study_name: HeldStudy(s.n_trials, s.directions[0].name.lower())
            for s in optuna.get_all_study_summaries(storage)}


def _record(line: bytes) -> dict | None:
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("op_code"), int) else None


def _why(line: bytes) -> str:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"byte {exc.start + 1} is not UTF-8 text"
    try:
        json.loads(text)
    except ValueError as exc:
        return f"not JSON: {str(exc).split(':')[0]}"
    return "JSON without an op_code"
