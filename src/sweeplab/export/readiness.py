"""The ANE readiness report: what of an export is known to leave the Apple Neural Engine or to break in fp16.

Computed on Linux, without Core ML, from the converted MIL program and a calibration batch (the export's real cases
when `export.real_data` is given, else its random ones):
- census: ops by kind and dtype; each op's estimated work (FLOPs from its shapes; data movement counts one per
  element moved); the ops a RULE says leave the Neural Engine, with their share of the work. An op kind that neither
  RULES nor KNOWN_READY knows is "not known to be ready": listed apart, never a blocker.
- fp16 range: on the fp32 program (the export itself when it is fp32, else an fp32 twin converted beside it), each op
  output whose values pass fp16's largest finite value (65,504) or fall under its smallest subnormal (2^-24), and the
  intermediates an op's rounded output hides (BOUNDS: an exp's input, a logsumexp's sum, a norm's sum of squares).
- fp16 against fp32: each layer's output in the fp16 program against the fp32 twin's on the same inputs, and the
  error the layer adds to its inputs' (the layers worth keeping in fp32: `export.fp32_layers`).
- placement: on macOS 14.4+ the compute plan's device and cost per op (`compute_plan_placement`; written against
  coremltools 9.0's MLComputePlan API, never run here: there is no Mac). Elsewhere the report says placement is
  unverified.

A layer is an op's name in the converted program without the converter's precision suffixes (`convert.layer_name`):
the name `export.fp32_layers` takes. Everything here is a static reading of published rules: the Neural Engine
compiler is not public, and only MLComputePlan on a Mac says where an op runs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sweeplab.export.convert import layer_name
from sweeplab.export.reference import ReferenceProgram

FP16_MAX = 65504.0  # IEEE 754 binary16: largest finite value
FP16_TINY = 2.0**-24  # smallest subnormal: a non-zero value under it rounds to 0
EXP_LIMIT = math.log(FP16_MAX)  # 11.09: exp(x) overflows fp16 above it
SOFTPLUS_LIMIT = 10.4  # apple/coremltools#2687: fp16 softplus jumps at x ~ 10.4 (its exp(x) term)
UNDERFLOW_SHARE = 0.01  # report a tensor when this share of its non-zero values flushes to zero
CALIBRATION_CASES = 2  # batches evaluated (each runs the fp32 and the fp16 program op by op)
VERDICT_CLEAR = "no known blocker (placement unverified)"
RANGE_KINDS = {"overflow": "overflow", "inside": "overflow inside the op", "underflow": "underflow"}


@dataclass(frozen=True)
class Rule:
    """A published reason an op leaves the Neural Engine (or cannot run in Core ML at all)."""

    what: str
    source: str


# Every rule names where it comes from. The issues and pages are public; none was re-measured here (no Mac).
RULES = {
    "fp32": Rule(
        "fp32-typed compute op: the Neural Engine computes in fp16, an fp32 op runs on the GPU or CPU",
        "coremltools docs, Typed Execution (a float 32 typed model executes on the GPU and CPU): "
        "apple.github.io/coremltools/docs-guides/source/typed-execution-example.html; github.com/hollance/neural-engine/blob/master/docs/16-bit.md",
    ),
    "gather": Rule(
        "gather / embedding lookup (gather, gather_nd, gather_along_axis, scatter)",
        "apple/coremltools#1103 (gather as slow with ALL as CPU-only); github.com/hollance/neural-engine/blob/master/docs/unsupported-layers.md; "
        "roboflow/rf-detr#1495 (MLComputePlan, M3 Pro: gather_along_axis on the CPU)",
    ),
    "topk": Rule(
        "topk / argsort",
        "roboflow/rf-detr#1495 (MLComputePlan, M3 Pro, coremltools 9.0: topk on the CPU in every RF-DETR model)",
    ),
    "index_plumbing": Rule(
        "integer op on the indices of a gather or topk (the int16/uint16 casts coremltools inserts, id arithmetic)",
        "roboflow/rf-detr#1495 (the ops consuming topk's indices leave with it); apple/ml-ane-transformers "
        "(the Neural Engine computes fp16 tensors)",
    ),
    "dynamic_shape": Rule(
        "dynamic (range) dimension: a range-flexible model runs on the Neural Engine at its default shape only",
        "Apple engineer, developer.apple.com/forums/thread/724930; coremltools docs, Flexible Input Shapes "
        "(EnumeratedShapes: every listed shape can run on the Neural Engine)",
    ),
    "rank_gt_5": Rule(
        "tensor of rank > 5: Core ML itself supports rank <= 5 (no compute unit runs it)",
        "apple/coremltools#1723, #2291, #832 (maintainers: a Core ML framework limit)",
    ),
}
GATHER_OPS = frozenset({"gather", "gather_nd", "gather_along_axis", "scatter", "scatter_nd", "scatter_along_axis"})
TOPK_OPS = frozenset({"topk", "argsort"})
# Op kinds with public evidence of Neural Engine execution in fp16: the ops of apple/ml-ane-transformers' reference
# DistilBERT (1x1 conv, einsum, softmax, layer norm, elementwise, split/concat/reshape/transpose), which Apple's
# "Deploying Transformers on the Apple Neural Engine" (2022) reports running on the Neural Engine, and the
# activations, normalizations and data movement listed as native in ane-guide's "Capability surface". Unverified
# per op here; an op kind outside this set and RULES is "not known to be ready".
KNOWN_READY = frozenset({
    "conv", "linear", "matmul", "einsum", "add", "sub", "mul", "real_div", "maximum", "minimum", "pow", "square",
    "layer_norm", "batch_norm", "instance_norm", "l2_norm", "softmax", "gelu", "silu", "sigmoid", "tanh", "relu",
    "exp", "rsqrt", "sqrt", "inverse", "clip", "reduce_mean", "reduce_sum", "reduce_max", "reshape", "transpose",
    "expand_dims", "squeeze", "concat", "split", "slice_by_index", "pad", "tile", "cast",
})
DATA_MOVEMENT = frozenset({"reshape", "transpose", "expand_dims", "squeeze", "concat", "split", "slice_by_index",
                           "slice_by_size", "pad", "tile", "cast", "gather", "gather_nd", "gather_along_axis"})


# --- the op census -------------------------------------------------------------------------------
def _dtype(var) -> str:
    from coremltools.converters.mil.mil import types

    return types.builtin_to_string(var.dtype)


def _is_float(var) -> bool:
    return _dtype(var) in ("fp16", "fp32", "fp64")


def _size(var) -> int:
    shape = var.shape or ()
    return int(np.prod([d if isinstance(d, (int, np.integer)) else 1 for d in shape])) if shape else 1


def _args(op) -> list:
    out = []
    for arg in op.inputs.values():
        out += list(arg) if isinstance(arg, (list, tuple)) else [arg]
    return out


def op_work(op) -> float:
    """Estimated work of one op: multiply-adds x 2 for linear, matmul, conv and einsum (from their shapes), one per
    element moved for data movement, and one per element read or written (the larger) for everything else."""
    kind, out = op.op_type, _size(op.outputs[0])
    if kind == "linear":
        return 2.0 * out * int(op.x.shape[-1])
    if kind == "matmul":
        transpose = op.transpose_x is not None and bool(op.transpose_x.val)
        return 2.0 * out * int(op.x.shape[-2] if transpose else op.x.shape[-1])
    if kind == "conv":
        return 2.0 * out * int(np.prod(op.weight.shape[1:]))
    if kind == "einsum":
        sizes: dict[str, int] = {}
        operands = op.equation.val.replace(" ", "").split("->")[0].split(",")
        for letters, var in zip(operands, op.values):
            sizes.update({letter: int(d) for letter, d in zip(letters, var.shape)})
        return 2.0 * float(np.prod(list(sizes.values())))
    if kind in DATA_MOVEMENT:
        return float(sum(_size(v) for v in op.outputs))
    return float(max([out] + [_size(v) for v in _args(op) if v.op is None or v.op.op_type != "const"]))


def _rule_hits(function, dynamic: bool) -> dict[str, list[str]]:
    """op name -> the RULES ids that apply to it."""
    from coremltools.converters.mil.mil.types.symbolic import any_symbolic

    hits: dict[str, list[str]] = {}
    for op in function.operations:
        if op.op_type == "const":
            continue
        found = []
        if any(_dtype(v) == "fp32" for v in op.outputs if _is_float(v)) and op.op_type not in DATA_MOVEMENT - {"cast"}:
            found.append("fp32")
        if op.op_type in GATHER_OPS:
            found.append("gather")
        if op.op_type in TOPK_OPS:
            found.append("topk")
        if any(len(v.shape or ()) > 5 for v in op.outputs):
            found.append("rank_gt_5")
        if dynamic and any(any_symbolic(v.shape) for v in op.outputs):
            found.append("dynamic_shape")
        if found:
            hits[op.name] = found
    for op in _index_plumbing(function):
        hits.setdefault(op.name, []).append("index_plumbing")
    return hits


def _index_plumbing(function) -> list:
    """Integer-typed ops that make a gather's indices (walking back) or use a topk's indices (walking forward)."""
    seen: dict[str, object] = {}

    def integer(op) -> bool:
        return op is not None and op.op_type != "const" and not any(_is_float(v) for v in op.outputs)

    stack = []
    for op in function.operations:
        if op.op_type in GATHER_OPS and getattr(op, "indices", None) is not None:
            stack.append(op.indices.op)
        if op.op_type in TOPK_OPS:
            stack += [child for v in op.outputs if not _is_float(v) for child in v.child_ops]
    while stack:
        op = stack.pop()
        if not integer(op) or op.name in seen or op.op_type in GATHER_OPS | TOPK_OPS:
            continue
        seen[op.name] = op
        stack += [v.op for v in _args(op)]  # what made it
        stack += [child for v in op.outputs for child in v.child_ops]  # and what uses it, while still integer
    return list(seen.values())


def census(function, dynamic: bool) -> dict:
    """Ops by kind and dtype, the work each group holds, and the ops RULES flag, with their share of the work."""
    by_kind: Counter = Counter()
    work: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for op in function.operations:
        if op.op_type == "const":
            continue
        dtype = "/".join(sorted({_dtype(v) for v in op.outputs}))
        by_kind[f"{op.op_type} {dtype}"] += 1
        work[op.name], kinds[op.name] = op_work(op), op.op_type
    total = sum(work.values()) or 1.0
    hits = _rule_hits(function, dynamic)
    unready = []
    for rule_id, rule in RULES.items():
        names = [name for name, ids in hits.items() if rule_id in ids]
        if names:
            unready.append({
                "rule": rule_id, "what": rule.what, "source": rule.source,
                "ops": dict(Counter(kinds[n] for n in names)), "layers": sorted({layer_name(n) for n in names}),
                "work_share": sum(work[n] for n in names) / total,
            })
    unknown = [n for n in work if n not in hits and kinds[n] not in KNOWN_READY]
    return {
        "ops_by_kind_dtype": dict(by_kind.most_common()),
        "total_work": total,
        "work_unit": "estimated FLOPs (2 x multiply-adds; data movement and elementwise: 1 per element)",
        "unready": unready,
        "unready_work_share": sum(work[n] for n in hits) / total,
        "not_known_ready": {
            "ops": dict(Counter(kinds[n] for n in unknown)),
            "work_share": sum(work[n] for n in unknown) / total,
        },
    }


# --- fp16 range, inside ops and out ---------------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    """An intermediate an op's rounded output hides: `value(op)` against `limit`."""

    what: str
    value: Callable
    limit: float
    blocker: bool  # False: whether the device keeps this intermediate in fp16 is not public (a risk, not a proof)
    source: str


def _x(op) -> np.ndarray:
    return np.asarray(op.x.val, dtype=np.float32)


def _axes(op, rank: int) -> tuple[int, ...]:
    axes = op.axes.val if getattr(op, "axes", None) is not None else range(rank)
    return tuple(int(a) % rank for a in np.atleast_1d(axes))


def _sum_exp(op) -> float:
    x = _x(op).astype(np.float64)
    return float(np.exp(x).sum(axis=_axes(op, x.ndim)).max())


def _sum_squares(op, centred: bool) -> float:
    x = _x(op).astype(np.float64)
    axes = _axes(op, x.ndim) if op.op_type != "instance_norm" else tuple(range(2, x.ndim))
    if centred:
        x = x - x.mean(axis=axes, keepdims=True)
    return float((x * x).sum(axis=axes).max())


def _smallest_positive_log_input(op) -> float:
    x = _x(op)
    positive = x[x > 0]
    return float(1.0 / positive.min()) if positive.size else 0.0  # compared as 1/x > 2^24


BOUNDS = {
    "exp": Bound("exp input above ln(65504) = 11.09", lambda op: float(_x(op).max()), EXP_LIMIT, True,
                 "IEEE fp16 range; apple/coremltools#2603 (fp16 precision loss: keep sensitive layers in fp32)"),
    "softplus": Bound("softplus input above 10.4 (its exp term)", lambda op: float(_x(op).max()), SOFTPLUS_LIMIT,
                      True, "apple/coremltools#2687 (fp16 softplus jumps at x ~ 10.4)"),
    "reduce_log_sum_exp": Bound("logsumexp's sum of exp above 65504", _sum_exp, FP16_MAX, True,
                                "apple/coremltools#2690 (channel logsumexp overflows in fp16 at x ~ 7.63)"),
    "softmax": Bound("softmax input above 11.09: overflows if the device does not subtract the row max first",
                     lambda op: float(_x(op).max()), EXP_LIMIT, False,
                     "apple/coremltools#2728 (fp16 log_softmax gives -inf when one class dominates)"),
    "layer_norm": Bound("layer_norm's sum of squared deviations above 65504", lambda op: _sum_squares(op, True),
                        FP16_MAX, False, "huggingface/swift-transformers#95 (norm activations in the 100,000s in fp16)"),
    "instance_norm": Bound("instance_norm's sum of squared deviations above 65504", lambda op: _sum_squares(op, True),
                           FP16_MAX, False, "huggingface/swift-transformers#95"),
    "reduce_l2_norm": Bound("l2 norm's sum of squares above 65504", lambda op: _sum_squares(op, False), FP16_MAX,
                            False, "huggingface/swift-transformers#95"),
    "reduce_mean": Bound("reduce_mean's sum above 65504", lambda op: float(np.abs(
        _x(op).astype(np.float64).sum(axis=_axes(op, _x(op).ndim))).max()), FP16_MAX, False,
        "huggingface/swift-transformers#95 (RMSNorm: mean of squares)"),
    "log": Bound("log input under 2^-24: 0 in fp16, so -inf", _smallest_positive_log_input, 1.0 / FP16_TINY, True,
                 "apple/coremltools#2728 (fp16 log_softmax gives -inf)"),
}


class RangeObserver:
    """A `ReferenceProgram.run` observer: per layer, the fp16 overflows and underflows of its outputs and BOUNDS.

    An overflow belongs to the layer that makes it: an op whose input already overflowed only carries it, and is
    listed under the maker's `carried_into`, not as a finding of its own.
    """

    def __init__(self):
        self.findings: dict[tuple[str, str], dict] = {}
        self.overflowing: dict[str, str] = {}  # var name -> the layer whose overflow it carries

    def _keep(self, layer: str, op, kind: str, value: float, limit: float, **extra) -> dict:
        key = (layer, kind)
        entry = self.findings.setdefault(key, {"layer": layer, "op": op.op_type, "kind": kind, "value": value,
                                               "limit": limit, **extra})
        entry["value"] = max(entry["value"], value)
        return entry

    def _overflow(self, layer: str, op, var, largest: float, count: int) -> None:
        makers = sorted({self.overflowing[v.name] for v in _args(op) if v.name in self.overflowing})
        if makers:
            for maker in makers:
                carried = self.findings[(maker, "overflow")].setdefault("carried_into", [])
                if layer not in carried:
                    carried.append(layer)
            self.overflowing[var.name] = makers[0]
            return
        self._keep(layer, op, "overflow", largest, FP16_MAX, blocker=True,
                   what=f"output past fp16's largest value ({count} elements)",
                   source="IEEE 754 binary16 (largest finite 65504)")
        self.overflowing[var.name] = layer

    def __call__(self, op, outputs: tuple) -> None:
        layer = layer_name(op.name)
        for var, value in zip(op.outputs, outputs):
            if not _is_float(var) or not isinstance(value, np.ndarray) or value.size == 0:
                continue
            magnitude = np.abs(value.astype(np.float32))
            finite = magnitude[np.isfinite(magnitude)]
            if finite.size and float(finite.max()) > FP16_MAX:
                self._overflow(layer, op, var, float(finite.max()), int((finite > FP16_MAX).sum()))
            nonzero = finite[finite > 0]
            tiny = int((nonzero < FP16_TINY).sum())
            if nonzero.size and tiny / nonzero.size >= UNDERFLOW_SHARE:
                self._keep(layer, op, "underflow", tiny / nonzero.size, UNDERFLOW_SHARE, blocker=False,
                           what="share of non-zero values under 2^-24 (0 in fp16)", source="IEEE 754 binary16")
        bound = BOUNDS.get(op.op_type)
        if bound is not None and getattr(op, "x", None) is not None:
            value = bound.value(op)
            if value > bound.limit:
                self._keep(layer, op, "inside", value, bound.limit, blocker=bound.blocker, what=bound.what,
                           source=bound.source)

    def rows(self) -> list[dict]:
        return sorted(self.findings.values(), key=lambda r: (not r["blocker"], r["kind"], r["layer"]))


# --- fp16 against fp32, per layer ----------------------------------------------------------------
class OutputRecorder:
    """Records each layer's first float output (the fp32 run), for `DiffObserver` to compare against."""

    def __init__(self):
        self.values: dict[str, np.ndarray] = {}

    def __call__(self, op, outputs: tuple) -> None:
        if outputs and isinstance(outputs[0], np.ndarray) and _is_float(op.outputs[0]):
            self.values[layer_name(op.name)] = np.asarray(outputs[0], dtype=np.float32)


class DiffObserver:
    """Per layer of the fp16 run: max|fp16 - fp32| / max|fp32| of its output, and how much of it the layer adds
    (its error less the largest error among the layers that feed it)."""

    def __init__(self, reference: dict[str, np.ndarray]):
        self.reference = reference
        self.rel: dict[str, float] = {}
        self.added: dict[str, float] = {}
        self.kinds: dict[str, str] = {}

    def __call__(self, op, outputs: tuple) -> None:
        layer = layer_name(op.name)
        expected = self.reference.get(layer)
        if expected is None or not outputs or not isinstance(outputs[0], np.ndarray) or not _is_float(op.outputs[0]):
            return
        actual = np.asarray(outputs[0]).astype(np.float16).astype(np.float32)  # what the program stores
        if actual.shape != expected.shape:
            return
        scale = float(np.abs(expected).max())
        diff = np.abs(np.nan_to_num(actual, nan=np.inf) - expected)
        rel = float(diff.max()) / scale if scale > 0 else float(diff.max() > 0)
        upstream = max([self.rel.get(layer_name(v.op.name), 0.0) for v in _args(op) if v.op is not None], default=0.0)
        self.rel[layer] = max(self.rel.get(layer, 0.0), rel)
        self.added[layer] = max(self.added.get(layer, 0.0), rel - upstream)
        self.kinds[layer] = op.op_type

    def rows(self, threshold: float) -> list[dict]:
        rows = [{"layer": k, "op": self.kinds[k], "rel_err": self.rel[k], "added": self.added[k]}
                for k in self.rel if self.added[k] > threshold]
        return sorted(rows, key=lambda r: -r["added"])


# --- the report ----------------------------------------------------------------------------------
def calibration(cases: list, count: int = CALIBRATION_CASES) -> tuple[list, str]:
    """The cases to calibrate on (real ones first) and what they are, for the report."""
    real = [c for c in cases if c.name.startswith("real")]
    chosen = (real or cases)[:count]
    return chosen, ("real inputs (export.real_data)" if real else "random ids (no export.real_data given)")


def _dynamic(program: ReferenceProgram) -> bool:
    """A range-flexible input (RangeDim); EnumeratedShapes are evaluated at each listed shape, so they are static."""
    from coremltools.converters.mil.mil.types.symbolic import any_symbolic

    return any(any_symbolic(var.shape) and program.allowed_shapes(name) is None
               for name, var in program.function.inputs.items())


def readiness(program: ReferenceProgram, fp32_program: ReferenceProgram | None, cases: list, tolerance: float,
              placement: dict | None = None) -> dict:
    """The readiness report of the exported `program`; `fp32_program` is its fp32 twin (None: `program` is fp32)."""
    chosen, source = calibration(cases)
    shapes = {name: np.shape(value) for name, value in chosen[0].inputs.items()} if chosen else {}
    function = program.function_for(shapes) if shapes else program.function
    report: dict = {"calibration": {"inputs": source, "cases": [c.name for c in chosen]},
                    **census(function, _dynamic(program))}
    ranges = RangeObserver()
    reference = fp32_program or program
    diffs = DiffObserver({}) if fp32_program is not None else None
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is what is being measured: no warning per op
        for case in chosen:
            recorder = OutputRecorder()
            reference.run(case.inputs, observe=lambda op, out, r=recorder: (ranges(op, out), r(op, out)))
            if diffs is not None:
                diffs.reference = recorder.values
                program.run(case.inputs, observe=diffs)
    report["fp16_range"] = ranges.rows() if chosen else {"skipped": "no calibration inputs (export.verify=false)"}
    if diffs is None or not chosen:
        report["fp16_vs_fp32"] = {"skipped": "an fp32 export: no fp16 program to compare" if chosen
                                  else "no calibration inputs (export.verify=false)"}
    else:
        report["fp16_vs_fp32"] = {"threshold": tolerance, "layers": diffs.rows(tolerance)}
    report["placement"] = placement or {"skipped": "needs MLComputePlan (macOS 14.4+); placement unverified"}
    report["blockers"] = blockers(report)
    report["verdict"] = "blockers: " + "; ".join(report["blockers"]) if report["blockers"] else VERDICT_CLEAR
    return report


def blockers(report: dict) -> list[str]:
    """One phrase per blocker: each rule that flags ops (with their share of the work), each fp16 overflow."""
    out = [f"{u['rule']} ({', '.join(f'{k} x{n}' for k, n in u['ops'].items())}; {u['work_share']:.1%} of work)"
           for u in report["unready"]]
    ranges = report["fp16_range"] if isinstance(report["fp16_range"], list) else []
    out += [f"fp16 {RANGE_KINDS[r['kind']]} in {r['layer']} ({r['op']}: {r['value']:.4g} > {r['limit']:.4g})"
            for r in ranges if r["blocker"]]
    return out


def fp32_candidates(report: dict) -> list[str]:
    """The layers `export.fp32_layers=auto` keeps in fp32: each layer with an fp16 overflow the report calls a blocker
    (its output, or inside the op), and each layer that adds more than the tolerance against fp32."""
    ranges = report["fp16_range"] if isinstance(report["fp16_range"], list) else []
    layers = [r["layer"] for r in ranges if r["blocker"]]
    layers += [r["layer"] for r in report["fp16_vs_fp32"].get("layers", [])]
    return list(dict.fromkeys(layers))


def metrics(report: dict) -> dict[str, float]:
    """What the export logs to MLflow (under export/<variant>/)."""
    ranges = report["fp16_range"] if isinstance(report["fp16_range"], list) else []
    return {
        "ane_unready_work_share": report["unready_work_share"],
        "ane_not_known_ready_work_share": report["not_known_ready"]["work_share"],
        "fp16_overflow_tensors": sum(r["kind"] == "overflow" for r in ranges),
        "fp16_hidden_overflows": sum(r["kind"] == "inside" and r["blocker"] for r in ranges),
        "ane_blockers": len(report["blockers"]),
    }


def markdown_lines(report: dict) -> list[str]:
    """The readiness section of the Markdown report."""
    lines = ["## ANE readiness", "", f"**Verdict:** {report['verdict']}", "",
             f"Calibration: {report['calibration']['inputs']}: {', '.join(report['calibration']['cases']) or 'none'}. "
             f"Work: {report['work_unit']}. Ops that leave the Neural Engine hold {report['unready_work_share']:.1%} "
             f"of it; ops not known to be ready {report['not_known_ready']['work_share']:.1%} "
             f"({_counts(report['not_known_ready']['ops']) or 'none'}).", ""]
    if report["unready"]:
        lines += ["| rule | ops | layers | share of work | source |", "|---|---|---|---|---|"]
        lines += [f"| {u['rule']}: {u['what']} | {_counts(u['ops'])} | {_short(u['layers'])} | {u['work_share']:.1%} "
                  f"| {u['source']} |" for u in report["unready"]]
        lines.append("")
    ranges = report["fp16_range"]
    if isinstance(ranges, dict):
        lines += [f"fp16 range: skipped: {ranges['skipped']}", ""]
    elif ranges:
        lines += ["| layer | op | fp16 finding | value | limit | blocker | source |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r['op']} | {RANGE_KINDS[r['kind']]}: {r['what']}{_carried(r)} | {r['value']:.4g} "
                  f"| {r['limit']:.4g} | {'yes' if r['blocker'] else 'risk'} | {r['source']} |" for r in ranges]
        lines.append("")
    else:
        lines += ["fp16 range: every tensor and known intermediate within fp16 on the calibration inputs.", ""]
    lines += _diff_lines(report["fp16_vs_fp32"])
    placement = report["placement"]
    lines += [f"Placement: {placement.get('skipped') or _placement_summary(placement)}", "",
              "| op dtype | count |", "|---|---|"]
    lines += [f"| {kind} | {n} |" for kind, n in report["ops_by_kind_dtype"].items()]
    return [*lines, ""]


def _diff_lines(diff: dict) -> list[str]:
    if "skipped" in diff:
        return [f"fp16 against fp32 per layer: skipped: {diff['skipped']}", ""]
    if not diff["layers"]:
        return [f"fp16 against fp32 per layer: no layer adds more than {diff['threshold']:.0e} (max|a - b| / max|b|).", ""]
    lines = [f"fp16 against fp32 per layer (layers adding more than {diff['threshold']:.0e}; candidates for "
             "`export.fp32_layers`):", "", "| layer | op | rel_err | added |", "|---|---|---|---|"]
    return [*lines, *(f"| {r['layer']} | {r['op']} | {r['rel_err']:.3g} | {r['added']:.3g} |" for r in diff["layers"]), ""]


def _carried(row: dict) -> str:
    return f"; carried into {_short(row['carried_into'])}" if row.get("carried_into") else ""


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} x{n}" for k, n in counts.items())


def _short(names: Iterable[str], limit: int = 6) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)})" if len(names) > limit else "")


def _placement_summary(placement: dict) -> str:
    share = placement.get("cost_share", {})
    return ", ".join(f"{device} {value:.1%} of estimated cost" for device, value in share.items())


# --- macOS: the real placement (untested here) ---------------------------------------------------
def compute_plan_placement(path: Path) -> dict | None:
    """MLComputePlan's preferred device and estimated cost per op, keyed by layer (macOS 14.4+, CPU_AND_NE).

    Written against coremltools 9.0's `coremltools.models.compute_plan` API and NEVER RUN: there is no Mac here.
    Returns None where the plan cannot be had (off macOS, older macOS, a package the host cannot load), so the
    report says "placement unverified" instead of inventing one.
    """
    from sweeplab.export import verify

    if verify.why_not_here(path, needs=verify.COMPUTE_PLAN_MACOS) is not None:
        return None
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    plan = MLComputePlan.load_from_path(ct.models.utils.compile_model(str(path)), compute_units=ct.ComputeUnit.CPU_AND_NE)
    by_layer: dict[str, dict] = {}
    cost: Counter = Counter()
    for operation in plan.model_structure.program.functions["main"].block.operations:
        if operation.operator_name == "const" or not operation.outputs:
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(operation)
        estimate = plan.get_estimated_cost_for_mlprogram_operation(operation)
        device = verify._device_kind(usage.preferred_compute_device) if usage is not None else "unknown"
        weight = estimate.weight if estimate is not None else 0.0
        by_layer[layer_name(operation.outputs[0].name)] = {"op": operation.operator_name, "device": device, "cost": weight}
        cost[device] += weight
    total = sum(cost.values()) or 1.0
    return {"by_layer": by_layer, "cost_share": {k: v / total for k, v in sorted(cost.items())}}


__all__ = [
    "BOUNDS",
    "KNOWN_READY",
    "RULES",
    "calibration",
    "census",
    "compute_plan_placement",
    "fp32_candidates",
    "markdown_lines",
    "metrics",
    "op_work",
    "readiness",
]
