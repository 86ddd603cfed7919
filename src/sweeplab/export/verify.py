"""Does the package compute what the PyTorch model computes? Inputs, error measures, and the checks that use them.

Error measures: see ERROR_MEASURES (also printed in every report).

Inputs: random batches (ids over the whole vocabulary, its first and last id included, so an index that a 16-bit
cast would break shows up; all-ones masks and right-padded masks of random lengths), and real batches from
`real_data` when given. With EnumeratedShapes every allowed length gets its own cases.

On macOS the same cases also run through Core ML itself (`MLModel.predict`, on the CPU and the Neural Engine) and the
compute plan says where each op would run (macOS 14.4+); elsewhere, and on a macOS older than the package's target
(loading such a package aborts), each is skipped with the reason in the report.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sweeplab.core.errors import DataFormatError, UserError
from sweeplab.export import isolated
from sweeplab.families import get_family, resolve

NOT_ON_MAC = "needs macOS (the Core ML runtime); this is {platform}"
COMPUTE_PLAN_MACOS = (14, 4)  # MLComputePlan (coremltools.models.compute_plan) needs macOS 14.4 or newer
# The first macOS whose Core ML loads each specification version: coremltools/__init__.py names versions 4-10 after
# the iOS13-iOS26 targets, whose macOS releases are these (iOS17 -> macOS 14, the export's default target).
SPEC_MIN_MACOS = {4: (10, 15), 5: (11, 0), 6: (12, 0), 7: (13, 0), 8: (14, 0), 9: (15, 0), 10: (26, 0)}
ERROR_MEASURES = """\
Per verification case (one input batch), package output `a` against the PyTorch output `b` of the trained model
(fp32, standard layout): `max_abs_err` = max |a - b| over every element; `rel_err` = max |a - b| / max |b|, the
largest error relative to the output's largest magnitude (not per element, which explodes where b is near 0).
A case passes when rel_err <= the variant's tolerance and the package output holds no NaN or Inf; the reported
numbers are the worst over all cases."""


@dataclass
class Case:
    name: str
    input_ids: np.ndarray  # (B, S) int32
    attention_mask: np.ndarray  # (B, S) int32, 0/1
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # float32 inputs after those two (ExportSpec.extra_inputs)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, **self.extra}


# --- inputs --------------------------------------------------------------------------------------
def random_cases(vocab_size: int, batch_size: int, seq_lens: list[int], n: int, seed: int = 0) -> list[Case]:
    """n cases per sequence length: the first with every token real, the others right-padded to random lengths."""
    rng = np.random.default_rng(seed)
    cases = []
    for seq_len in seq_lens:
        for i in range(n):
            ids = rng.integers(0, vocab_size, size=(batch_size, seq_len), dtype=np.int64).astype(np.int32)
            ids[0, 0], ids[-1, -1] = vocab_size - 1, 0  # both ends of the embedding table
            mask = np.ones((batch_size, seq_len), dtype=np.int32)
            if i > 0:
                for row in range(batch_size):
                    mask[row, rng.integers(1, seq_len + 1) :] = 0
            cases.append(Case(f"random S={seq_len} #{i}", ids, mask))
    return cases


def _pad_rows(rows: list[np.ndarray], seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(rows), seq_len), pad_id, dtype=np.int32)
    mask = np.zeros((len(rows), seq_len), dtype=np.int32)
    for r, row in enumerate(rows):
        row = row[:seq_len]
        ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    return ids, mask


def real_cases(
    family: str, path: str | Path, vocab_size: int, batch_size: int, seq_lens: list[int], n: int, pad_id: int = 0
) -> list[Case]:
    """n batches of real token ids, read by the family's `ExportSpec.real_rows` (TextBridge: a dataset; the LM: a
    token .bin file of its cache)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"export.real_data={path}: no such file or directory")
    spec = get_family(family).export
    if spec is None or spec.real_rows is None:
        raise UserError(f"export.real_data={path}: the {family} family has no real-data reader; leave it unset")
    try:
        read_rows = resolve(spec.real_rows, f"family {family}", "export.real_rows")
        rows = read_rows(path, vocab_size, max(seq_lens), n * batch_size)
    except (DataFormatError, UserError) as exc:
        raise UserError(f"export.real_data={path}: {exc}") from None
    if not rows:
        raise UserError(f"export.real_data={path}: no samples with tokens")
    largest = max(int(row.max()) for row in rows)
    if largest >= vocab_size:
        raise UserError(
            f"export.real_data={path}: token id {largest} is outside the model's vocabulary ({vocab_size}): "
            "not the data this model was trained on"
        )
    cases = []
    for seq_len in seq_lens:
        for i in range(0, len(rows) - batch_size + 1, batch_size):
            ids, mask = _pad_rows(rows[i : i + batch_size], seq_len, pad_id)
            cases.append(Case(f"real S={seq_len} #{i // batch_size}", ids, mask))
    return cases


# --- comparing -----------------------------------------------------------------------------------
def errors(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise UserError(f"package output has shape {actual.shape}, the PyTorch model's has {expected.shape}")
    finite = np.isfinite(actual)
    diff = np.abs(np.where(finite, actual, 0.0) - expected)
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    return {
        "max_abs_err": max_abs,
        "rel_err": max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf")),
        "nonfinite": int((~finite).sum()),
    }


def torch_outputs(model: nn.Module, cases: list[Case]) -> list[np.ndarray]:
    with torch.no_grad():
        return [
            model(
                torch.from_numpy(c.input_ids).long(), torch.from_numpy(c.attention_mask).long(),
                *map(torch.from_numpy, c.extra.values()),
            ).float().numpy()
            for c in cases
        ]


def compare_cases(run, output_name: str, cases: list[Case], expected: list[np.ndarray], tolerance: float) -> dict:
    """Run every case through `run(inputs) -> {name: array}` and compare; the worst case decides `passed`."""
    rows = []
    for case, reference in zip(cases, expected):
        result = errors(run(case.inputs)[output_name], reference)
        rows.append({"case": case.name, **result})
    worst_rel = max(r["rel_err"] for r in rows)
    nonfinite = sum(r["nonfinite"] for r in rows)
    return {
        "cases": rows,
        "max_abs_err": max(r["max_abs_err"] for r in rows),
        "rel_err": worst_rel,
        "nonfinite": nonfinite,
        "tolerance": tolerance,
        "passed": bool(worst_rel <= tolerance and nonfinite == 0),
    }


def check_weights(package_weights: Mapping[str, np.ndarray], model: nn.Module, tolerance: float) -> dict:
    """Find every trained tensor of `model` among the package's constants, by value.

    For each float tensor w of the state dict (scalars such as α skipped, a tied tensor checked once, a tensor of
    one repeated value accepted as possibly folded away), the
    constant c with as many elements that is closest to it, flattened (the Linear -> 1x1-conv and Conv1d ->
    (1, k)-Conv2d reshapes keep the flattened order), must satisfy ||c - w|| / ||w|| <= `tolerance`. A weight that
    was re-initialised instead of loaded (the original paGating exporter's bug) is ~1.4 away; fp16 rounding is
    ~3e-4, int8 ~1e-2. `max_rel_diff` (max |c - w| / max |w|) is reported too.
    """
    by_size: dict[int, list[tuple[str, np.ndarray]]] = {}
    for name, value in package_weights.items():
        if value.dtype.kind == "f":
            by_size.setdefault(value.size, []).append((name, value.astype(np.float64).ravel()))
    seen, rows = set(), []
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point() or tensor.numel() < 2 or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        flat = tensor.detach().double().numpy().ravel()
        if flat.min() == flat.max():
            # a constant tensor (a LayerNorm's untouched ones or zeros): coremltools may fold it into a scalar or
            # drop it (x * 1, x + 0), and it holds no trained information a re-initialisation would lose
            rows.append({"tensor": name, "constant": "(constant tensor: may be folded)", "rel_err": 0.0, "max_rel_diff": 0.0})
            continue
        norm = max(float(np.linalg.norm(flat)), 1e-30)
        best = (float("inf"), None, float("inf"))
        for const, value in by_size.get(flat.size, []):
            diff = value - flat
            rel = float(np.linalg.norm(diff)) / norm
            if rel < best[0]:
                best = (rel, const, float(np.abs(diff).max()) / max(float(np.abs(flat).max()), 1e-30))
        rows.append({"tensor": name, "constant": best[1], "rel_err": best[0], "max_rel_diff": best[2]})
    missing = [r["tensor"] for r in rows if r["rel_err"] > tolerance]
    return {
        "tensors": len(rows),
        "found": len(rows) - len(missing),
        "missing": missing,
        "max_rel_err": max((r["rel_err"] for r in rows), default=0.0),
        "max_rel_diff": max((r["max_rel_diff"] for r in rows), default=0.0),
        "tolerance": tolerance,
        "passed": not missing,
        "rows": rows,
    }


# --- macOS only ----------------------------------------------------------------------------------
def host_macos() -> tuple[int, ...] | None:
    """This Mac's macOS version (platform.mac_ver), None off macOS or where it cannot be read."""
    if sys.platform != "darwin":
        return None
    try:
        return tuple(int(part) for part in platform.mac_ver()[0].split("."))
    except ValueError:
        return None


def _version(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def why_not_here(path: Path, needs: tuple[int, ...] | None = None) -> str | None:
    """Why Core ML cannot load the package at `path` on this host (off macOS; a macOS older than the package's
    target, where loading it aborts; older than `needs`), or None when it can."""
    host = host_macos()
    if host is None:
        return NOT_ON_MAC.format(platform=sys.platform) if sys.platform != "darwin" else "macOS version unreadable"
    from coremltools.models.utils import load_spec

    spec_version = load_spec(str(path)).specificationVersion
    target = SPEC_MIN_MACOS.get(spec_version)
    if target is None:
        return f"Core ML specification {spec_version} is newer than sweeplab knows; this Mac runs macOS {_version(host)}"
    if host < target:
        return (
            f"the package targets macOS {_version(target)}+ (Core ML specification {spec_version}); this Mac runs "
            f"macOS {_version(host)}: export with an older export.deployment_target to check it here"
        )
    if needs is not None and host < needs:
        return f"needs macOS {_version(needs)}+; this Mac runs macOS {_version(host)}"
    return None


def on_device(path: Path, output_name: str, cases: list[Case], expected: list[np.ndarray], tolerance: float) -> dict:
    """Core ML's own prediction on the same cases, with the CPU and the Neural Engine (CPU_AND_NE: with ALL, Core ML
    may run the package on the GPU, whose numerics are not the Neural Engine's), in a child process
    (`isolated.in_child`): a failed Neural Engine compile can let the load succeed and kill the process at the first
    predict (coremltools#2758), which then fails this check instead of the export. Skipped, with the reason, where
    `why_not_here` says the package cannot load."""
    reason = why_not_here(path)
    if reason is not None:
        return {"skipped": reason}
    try:
        outputs = isolated.in_child(f"{__name__}:predict_all", str(path), [c.inputs for c in cases], output_name)
    except isolated.ChildFailed as exc:
        return {"passed": False, "compute_units": "CPU_AND_NE",
                "error": f"Core ML prediction (CPU_AND_NE) in a child process: {exc} (a failed Neural Engine compile "
                         "kills the process at the first predict: coremltools#2758)"}
    results = iter(outputs)
    compared = compare_cases(lambda inputs: {output_name: next(results)}, output_name, cases, expected, tolerance)
    return {**compared, "compute_units": "CPU_AND_NE"}


def predict_all(path: str, inputs: list[dict], output_name: str) -> list[np.ndarray]:
    """What `on_device`'s child process runs: the package loaded for the CPU and the Neural Engine, each input
    predicted."""
    import coremltools as ct

    model = ct.models.MLModel(path, compute_units=ct.ComputeUnit.CPU_AND_NE)
    return [np.asarray(model.predict(x)[output_name]) for x in inputs]


def _device_kind(device) -> str:
    name = type(device).__name__
    return {"MLNeuralEngineComputeDevice": "neural_engine", "MLGPUComputeDevice": "gpu", "MLCPUComputeDevice": "cpu"}.get(
        name, name
    )


def placement(path: Path) -> dict:
    """MLComputePlan for the CPU and the Neural Engine (CPU_AND_NE): the share of ops and of estimated cost on each;
    skipped, with the reason, off macOS 14.4+ or where `why_not_here` says the package cannot load."""
    reason = why_not_here(path, needs=COMPUTE_PLAN_MACOS)
    if reason is not None:
        return {"skipped": f"MLComputePlan: {reason}"}
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    compiled = ct.models.utils.compile_model(str(path))
    plan = MLComputePlan.load_from_path(compiled, compute_units=ct.ComputeUnit.CPU_AND_NE)
    operations = plan.model_structure.program.functions["main"].block.operations
    ops: dict[str, int] = {}
    cost: dict[str, float] = {}
    per_op_type: dict[str, dict[str, int]] = {}
    for operation in operations:
        if operation.operator_name == "const":
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(operation)
        kind = _device_kind(usage.preferred_compute_device) if usage is not None else "unknown"
        estimate = plan.get_estimated_cost_for_mlprogram_operation(operation)
        ops[kind] = ops.get(kind, 0) + 1
        cost[kind] = cost.get(kind, 0.0) + (estimate.weight if estimate is not None else 0.0)
        per_op_type.setdefault(operation.operator_name, {}).setdefault(kind, 0)
        per_op_type[operation.operator_name][kind] += 1
    total_ops, total_cost = sum(ops.values()) or 1, sum(cost.values()) or 1.0
    return {
        "op_share": {k: v / total_ops for k, v in sorted(ops.items())},
        "cost_share": {k: v / total_cost for k, v in sorted(cost.items())},
        "ops": ops,
        "by_op_type": per_op_type,
        "compute_units": "CPU_AND_NE",
    }


__all__ = [
    "Case",
    "check_weights",
    "compare_cases",
    "errors",
    "host_macos",
    "on_device",
    "placement",
    "predict_all",
    "random_cases",
    "real_cases",
    "torch_outputs",
    "why_not_here",
]
