"""Checkpoints: written atomically with a checksum of their content, read back safely (`weights_only=True`) and
checked before anything uses them, with one-line errors.

The checksum (`CHECKSUM_KEY`, sha256, `content_checksum`) covers everything the checkpoint holds, by its place in the
dict: every tensor (the model's weights and buffers, the optimizer's state, the callbacks' tensors) with its dtype,
shape and bytes, and every plain value (numbers, strings, booleans, None: the step, the hyperparameters, the
schedules' and callbacks' state). It is computed by `AtomicCheckpointIO` over the exact dict it writes, after every hook has added
its part, so Lightning's checkpoints and the MLX loop's (which saves through the same class) carry it alike.
`read_checkpoint` recomputes it: a changed or corrupted file is refused; a checkpoint written before sweeplab
recorded checksums is accepted with a warning. Weights that are not finite are refused too, whatever the checksum
says (a run that diverged with `guard.mode=off` saves them honestly).
"""

from __future__ import annotations

import _compat_pickle
import hashlib
import importlib.util
import io
import logging
import numbers
import pickle
import pickletools
import sys
import time
import warnings
import zipfile
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from sweeplab.callbacks.faults import pause_in
from sweeplab.core import wall
from sweeplab.core.errors import UserError
from sweeplab.core.files import atomic_write
from sweeplab.runtime.devices import host_cpus

log = logging.getLogger(__name__)

CHECKSUM_KEY = "sweeplab_checksum"
WEIGHT_KEYS = ("state_dict", "optimizer_states")  # where a non-finite value means the weights are broken
_warned_unchecked: set[str] = set()  # a checkpoint without a checksum is named once per process


@dataclass
class LoadedModel:
    family: str
    model: nn.Module  # eval mode, on the CPU, trained weights loaded
    model_config: Any  # the family's config dataclass
    hparams: dict  # everything the task saved: model, loss/optim, ...
    path: Path
    global_step: int
    callback_states: dict = field(default_factory=dict)  # the checkpoint's "callbacks" (the best score, ...)


# --- the checksum --------------------------------------------------------------------------------
CHECKSUM_ALGORITHM = "sha256-tensors"  # what sweeplab writes (content_checksum)
LINEAR_ALGORITHM = "sha256"  # what it wrote before it hashed per tensor: still read and checked
CHECKSUM_ALGORITHMS = (CHECKSUM_ALGORITHM, LINEAR_ALGORITHM)


def content_checksum(checkpoint: Mapping[str, Any], algorithm: str = CHECKSUM_ALGORITHM) -> str:
    """sha256 over the checkpoint's tensors and plain values (the checksum itself left out), in sorted key order:
    the same for the dict that was saved and the dict that is loaded back, wherever its tensors lived.

    Each tensor enters with its place, dtype and shape, then its content. `sha256-tensors` (what is written): its
    content is its own sha256, the tensors hashed on several threads (hashlib releases the GIL), so a 1.3 GB
    checkpoint is hashed in a fraction of one stream's time; `sha256` (checkpoints written before): its bytes, all in
    one stream. Either way any changed byte, tensor, value or key changes the digest."""
    records: list[bytes | tuple[str, torch.Tensor]] = []
    _walk(records, "", {k: v for k, v in checkpoint.items() if k != CHECKSUM_KEY})
    tensors = [record for record in records if not isinstance(record, bytes)]
    if algorithm == LINEAR_ALGORITHM:  # one tensor's bytes at a time, in order
        tensor_parts = iter(_tensor_record(*tensor, hashed=False) for tensor in tensors)
    else:
        tensor_parts = iter(_tensor_records(tensors))
    digest = hashlib.sha256()
    for record in records:
        for part in (record,) if isinstance(record, bytes) else next(tensor_parts):
            digest.update(part)
    return digest.hexdigest()


def _walk(records: list, place: str, value: Any) -> None:
    """The checksum's stream in order: plain values and containers as bytes, each tensor as (place, tensor)."""
    if torch.is_tensor(value):
        records.append((place, value))
    elif isinstance(value, Mapping):
        records.append(f"{place}\0map\0{len(value)}\0".encode())
        for key in sorted(value, key=repr):
            _walk(records, f"{place}/{key!r}", value[key])
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        records.append(f"{place}\0seq\0{len(value)}\0".encode())
        for index, item in enumerate(items):
            _walk(records, f"{place}[{index}]", item)
    else:
        records.append(f"{place}\0{_plain_value(value)}\0".encode())


def _tensor_record(place: str, value: torch.Tensor, hashed: bool = True) -> tuple[bytes, bytes | memoryview]:
    """A tensor's part of the stream: its header (place, dtype, shape of its plain form), then its content: its
    bytes' sha256 (`hashed`), else the bytes themselves."""
    tensor = _plain_tensor(value)
    header = f"{place}\0tensor\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode()
    content = tensor.reshape(-1).view(torch.uint8).numpy().data
    return header, hashlib.sha256(content).digest() if hashed else content


def _tensor_records(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[bytes, bytes]]:
    """`_tensor_record` of each tensor, on up to 8 threads, leaving one core to whatever else runs (the training
    thread: a background write hashes while the next steps train)."""
    workers = min(8, len(tensors), max(1, host_cpus() - 1))
    if workers <= 1:
        return [_tensor_record(place, value) for place, value in tensors]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweeplab-checksum") as pool:
        return list(pool.map(lambda record: _tensor_record(*record), tensors))


def _plain_tensor(value: torch.Tensor) -> torch.Tensor:
    tensor = value.detach()
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    return tensor.cpu().contiguous()


def _plain_value(value: Any) -> str:
    """A value's text, the same after a save and a load (numpy scalars as Python numbers: their repr changes
    between numpy versions); a type this cannot render stably counts by its name only."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return f"int {int(value)}"
    if isinstance(value, numbers.Real):
        return f"float {float(value)!r}"
    if isinstance(value, numbers.Complex):
        return f"complex {complex(value)!r}"
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return f"<{type(value).__qualname__}>"


def with_checksum(checkpoint: Mapping[str, Any]) -> dict:
    """A shallow copy of the checkpoint with its checksum added (the caller's dict is left as it was)."""
    return {**checkpoint, CHECKSUM_KEY: {"algorithm": CHECKSUM_ALGORITHM, "digest": content_checksum(checkpoint)}}


def check_integrity(checkpoint: Mapping[str, Any], path: Path) -> None:
    """The checksum written at save time matches the content, and the weights are finite; one-line UserErrors."""
    recorded = checkpoint.get(CHECKSUM_KEY)
    if recorded is None:
        if str(path) not in _warned_unchecked:
            _warned_unchecked.add(str(path))
            log.warning("checkpoint %s carries no checksum (written before sweeplab recorded one): its integrity "
                        "cannot be checked, only that its weights are finite", path)
    elif not isinstance(recorded, Mapping) or recorded.get("algorithm") not in CHECKSUM_ALGORITHMS:
        raise UserError(f"checkpoint {path}: damaged: its checksum record is unreadable ({recorded!r:.60})")
    elif recorded.get("digest") != content_checksum(checkpoint, recorded["algorithm"]):
        raise UserError(f"checkpoint {path}: damaged: its content does not match the checksum written when it was "
                        "saved (a corrupted or edited file); use another checkpoint")
    bad = nonfinite_tensors(checkpoint)
    if bad:
        raise UserError(f"checkpoint {path}: holds non-finite weights ({', '.join(bad[:3])}"
                        f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}); refused before anything is touched")


def nonfinite_tensors(checkpoint: Mapping[str, Any]) -> list[str]:
    """'<name>: N NaN/inf' for each floating tensor of the weights and optimizer state that is not all finite."""
    found: list[str] = []

    def walk(place: str, value: Any) -> None:
        if torch.is_tensor(value):
            if value.is_floating_point() or value.is_complex():
                count = int((~torch.isfinite(value.detach())).sum())
                if count:
                    found.append(f"{place}: {count} NaN/inf")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{place}.{key}" if place else str(key), item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{place}[{index}]", item)

    for key in WEIGHT_KEYS:
        walk("" if key == "state_dict" else key, checkpoint.get(key))
    return found


# --- reading -------------------------------------------------------------------------------------
def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint dict, checked (checksum, finite weights); one-line UserErrors for a missing, truncated,
    damaged or foreign file, and for one that holds code."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path}: no such file")
    checkpoint = _load(path)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(f"checkpoint {path}: not a Lightning checkpoint (no state_dict)")
    hparams = checkpoint.get("hyper_parameters")
    family = hparams.get("family") if isinstance(hparams, Mapping) else None
    if not family:
        raise UserError(f"checkpoint {path}: not written by sweeplab (no model family in its hyperparameters)")
    check_integrity(checkpoint, path)
    return checkpoint


def _load(path: Path) -> Any:
    """torch.load with weights_only=True. A file that is not a checkpoint fails in whatever way its bytes make the
    reader fail (a damaged pickle raises KeyError or UnicodeDecodeError as readily as UnpicklingError): all are
    one line. A pickle that would run code is refused and said so."""
    try:
        with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: the error below says enough
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise UserError(f"checkpoint {path}: cannot be read: {exc.strerror or exc}") from None
    except pickle.UnpicklingError as exc:
        code = _pickled_code(path) if str(exc).startswith("Weights only load failed") else []
        if code:
            raise UserError(f"checkpoint {path}: refused: it holds Python code ({', '.join(code[:3])}) that loading it "
                            "would run; sweeplab loads only tensors and plain data from a checkpoint and never runs "
                            "code from one") from None
        raise UserError(_unreadable(path, exc)) from None
    except Exception as exc:  # every way an unreadable file makes the reader fail
        raise UserError(_unreadable(path, exc)) from None


PLAIN_GLOBALS = frozenset({"collections.OrderedDict", "builtins.set", "builtins.frozenset", "builtins.bytearray",
                           "builtins.complex", "builtins.slice", "builtins.range", "_codecs.encode"})


def _pickled_code(path: Path) -> list[str]:
    """The functions and classes (other than torch's own and plain containers) that the file's pickle would call
    when loaded, found by reading its opcodes (pickletools: nothing is run or imported). Only names that exist
    count: a name that exists nowhere is a damaged file, not code."""
    found = []
    for name in _pickled_globals(path):
        module, _, attribute = name.rpartition(".")
        # pickle protocols < 3 write Python 2's names (commands.Popen is subprocess.Popen): pickle's own table
        module, attribute = _compat_pickle.NAME_MAPPING.get((module, attribute), (module, attribute))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        name = f"{module}.{attribute}"
        if name in PLAIN_GLOBALS or module.split(".")[0] == "torch" or name in found:
            continue
        top = module.split(".")[0]
        try:
            known = top in sys.modules or importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            known = False
        if known and attribute.isidentifier():
            found.append(name)
    return found


def _pickled_globals(path: Path) -> list[str]:
    """'module.name' of every GLOBAL / STACK_GLOBAL opcode in the checkpoint's pickle(s), in order."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                data = archive.read(member) if member else b""
        else:
            data = path.read_bytes()
    except (OSError, zipfile.BadZipFile):
        return []
    names, pushed, memo, stream = [], [], {}, io.BytesIO(data)  # pushed: the strings pushed (None: anything else)
    while stream.tell() < len(data):  # the legacy format holds several pickles one after the other
        try:
            for opcode, arg, _ in pickletools.genops(stream):
                kind = opcode.name
                if kind == "GLOBAL":
                    names.append(".".join(str(arg).split(" ", 1)))
                elif kind == "STACK_GLOBAL" and len(pushed) >= 2 and None not in pushed[-2:]:
                    names.append(f"{pushed[-2]}.{pushed[-1]}")
                elif kind == "MEMOIZE":  # the next memo index, whatever the value
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif kind in ("PUT", "BINPUT", "LONG_BINPUT"):
                    memo[arg] = pushed[-1] if pushed else None
                elif kind in ("GET", "BINGET", "LONG_BINGET"):
                    pushed.append(memo.get(arg))
                elif opcode.stack_after:  # a push: a string's text, else a placeholder
                    pushed.append(arg if isinstance(arg, str) and ("UNICODE" in kind or "STRING" in kind) else None)
        except Exception:  # a damaged pickle: what was read so far is what there is
            break
    return names


def _unreadable(path: Path, exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):  # not PyTorch's advice to load it unsafely
        lines = [next((line for line in lines if "Unsupported" in line), "its pickle is not plain data")]
    first = lines[0] if lines else type(exc).__name__
    return f"checkpoint {path}: not a readable PyTorch checkpoint (truncated or corrupt): {type(exc).__name__}: {first[:200]}"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary file and renamed (a kill mid-save never leaves a truncated checkpoint),
    with the checksum of their content; read back through `read_checkpoint` (weights_only=True: a checkpoint can
    only hold tensors and plain data, never code; checksum and finite weights checked).

    `background=True`: the training thread only takes a CPU copy of the checkpoint (a point-in-time snapshot: the
    next step cannot change what is written); one writer thread serialises it, hashes it and renames it into place.
    At most one write is in flight: the next save first waits for it, so at most one copy is held. Removals (the
    previous best file) queue behind the writes, in the order Lightning asked for them, so the files on disk always
    pass through the same states as with synchronous writes, only later. `wait()` (Lightning calls it through
    `teardown` at the end of fit, also after an exception or a stop) joins the writer and raises its error, if any."""

    def __init__(self, background: bool = False):
        super().__init__()
        self.background = background
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.copy_s = 0.0  # training-thread time spent copying states and waiting for the writer (the job's breakdown)

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if not self.background:
            started = time.perf_counter()
            _write(checkpoint, path)
            self.copy_s += time.perf_counter() - started
            return
        started = time.perf_counter()
        self.wait()  # at most one write in flight
        snapshot = apply_to_collection(checkpoint, torch.Tensor, _cpu_copy)
        self._submit(_write, snapshot, path)
        self.copy_s += time.perf_counter() - started

    def remove_checkpoint(self, path) -> None:
        if self.background:
            self._submit(super().remove_checkpoint, path)
        else:
            super().remove_checkpoint(path)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        self.wait()  # a file being written is read whole
        return read_checkpoint(path)

    def wait(self) -> None:
        """Block until every queued write and removal is done; the first error any of them raised is raised here."""
        pending, self._pending = self._pending, []
        error = None
        for future in pending:
            exc = future.exception()
            error = error or exc
        if error is not None:
            raise error

    def teardown(self) -> None:
        try:
            with wall.clock().within("checkpoints"):
                self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None

    def _submit(self, function, *args) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweeplab-checkpoint-writer")
        self._pending.append(self._writer.submit(function, *args))


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    # a copy even when the tensor is already on the CPU: the optimizer updates the original in place
    return tensor.detach().to("cpu", copy=True)


def _write(checkpoint: dict, path) -> None:
    with atomic_write(path) as f:
        pause_in("checkpointing")  # reliability tests: a signal lands inside the save
        torch.save(with_checksum(checkpoint), f)
        f.flush()
        pause_in("checkpoint-written")  # tests: the bytes are in the temporary file, not yet renamed (a kill here)
