"""The export report: what was exported, how, what the package holds, and how well it matches PyTorch.

Written next to the package as <name>.<format>.report.json (everything) and <name>.<format>.report.md (the same, for
people).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from sweeplab.export.readiness import markdown_lines

NEURAL_ENGINE_NOTES = {
    "fp32": "fp32 programs never run on the Neural Engine (GPU/CPU only); export fp16 for it.",
    "gather": "gather (the embedding lookup) runs on the CPU on every Apple device.",
    "standard": "standard layout: (B, S, C) tensors and linear layers; layout=ane is the Neural-Engine layout.",
}


def package_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _bits(dtype_name: str) -> int:
    digits = re.findall(r"\d+", dtype_name)
    return int(digits[-1]) if digits else 8  # bool


def stored_weights(function) -> dict:
    """Constant tensors as stored (compressed ones as their int8/uint-n data and scales): dtype -> count, size."""
    from coremltools.converters.mil.mil import types

    by_dtype: dict[str, dict[str, int]] = {}
    for op in function.operations:
        if op.op_type != "const":
            continue
        value = op.outputs[0].val
        if not isinstance(value, np.ndarray) or value.size < 2:
            continue
        name = types.builtin_to_string(op.outputs[0].dtype)
        entry = by_dtype.setdefault(name, {"tensors": 0, "elements": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["elements"] += int(value.size)
        entry["bytes"] += int(value.size) * _bits(name) // 8
    return dict(sorted(by_dtype.items()))


def interface(spec) -> dict:
    """Inputs and outputs as the model description declares them (names, dtypes, shapes or enumerated shapes)."""
    from coremltools.proto import FeatureTypes_pb2

    def describe(feature) -> dict:
        array = feature.type.multiArrayType
        entry = {
            "dtype": FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(array.dataType).lower(),
            "shape": list(array.shape),
            "description": feature.shortDescription,
        }
        if array.WhichOneof("ShapeFlexibility") == "enumeratedShapes":
            entry["enumerated_shapes"] = [list(s.shape) for s in array.enumeratedShapes.shapes]
        return entry

    return {
        "inputs": {f.name: describe(f) for f in spec.description.input},
        "outputs": {f.name: describe(f) for f in spec.description.output},
    }


def op_histogram(function) -> dict[str, int]:
    counts = Counter(op.op_type for op in function.operations if op.op_type != "const")
    return dict(counts.most_common())


def notes(options, ops: dict[str, int]) -> list[str]:
    out = []
    if options.precision == "fp32":
        out.append(NEURAL_ENGINE_NOTES["fp32"])
    if "gather" in ops:
        out.append(NEURAL_ENGINE_NOTES["gather"])
    if options.layout == "standard":
        out.append(NEURAL_ENGINE_NOTES["standard"])
    return out


# --- Markdown ------------------------------------------------------------------------------------
def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def check_lines(title: str, check: dict) -> list[str]:
    """A check's verdict line, its note where it has one, and its table of cases, as Markdown (the Core ML report's
    and the Core AI report's)."""
    if "skipped" in check:
        return [f"**{title}:** skipped: {check['skipped']}", ""]
    if "error" in check:
        return [f"**{title}:** FAILED: {check['error']}", ""]
    verdict = "passed" if check["passed"] else "FAILED"
    lines = [
        f"**{title}:** {verdict}: rel_err {_fmt(check['rel_err'])} (tolerance {_fmt(check['tolerance'])}), "
        f"max_abs_err {_fmt(check['max_abs_err'])}, NaN/Inf {check['nonfinite']}",
        "",
    ]
    if check.get("note"):
        lines += [f"({check['note']})", ""]
    lines += ["| case | max_abs_err | rel_err | NaN/Inf |", "|---|---|---|---|"]
    lines += [f"| {r['case']} | {_fmt(r['max_abs_err'])} | {_fmt(r['rel_err'])} | {r['nonfinite']} |" for r in check["cases"]]
    return [*lines, ""]


def source_line(src: dict) -> str:
    """The report's line naming the model and the checkpoint it came from (the Core ML and Core AI reports')."""
    return (f"- model: {src['family']} from `{src['checkpoint']}` (step {src['global_step']})"
            + (f", MLflow run {src['run_id']}" if src.get("run_id") else ""))


def markdown(report: dict) -> str:
    src, conv, weights = report["source"], report["conversion"], report["weights"]
    lines = [
        f"# Core ML export: {Path(report['package']).name} ({report['status']})",
        "",
        source_line(src),
        f"- variant: {report['variant']}, minimum target {conv['deployment_target']}, "
        f"traced with {conv['tracer']}" + (f" ({conv['fallback_reason']})" if conv.get("fallback_reason") else ""),
        f"- time: trace {conv['trace_s']:.2f} s, convert {conv['convert_s']:.2f} s, compress {conv['compress_s']:.2f} s, "
        f"verify {report['verification'].get('seconds', 0):.2f} s",
        f"- package: {weights['package_bytes'] / 1e6:.3f} MB (weights file {weights['weight_file_bytes'] / 1e6:.3f} MB)",
        "",
        "## Interface",
        "",
        "| name | kind | dtype | shape |",
        "|---|---|---|---|",
    ]
    for kind in ("inputs", "outputs"):
        for name, entry in report["interface"][kind].items():
            shape = entry.get("enumerated_shapes") or entry["shape"]
            lines.append(f"| {name} | {kind[:-1]} | {entry['dtype']} | {shape} |")
    verification = report["verification"]
    lines += ["", "## Verification", "", verification["definition"], ""]
    lines += check_lines("Reference evaluator (Linux, numpy)", verification["reference"])
    trained = verification["trained_weights"]
    lines += [
        f"**Trained weights in the package:** {'passed' if trained['passed'] else 'FAILED'}: "
        f"{trained['found']}/{trained['tensors']} checkpoint tensors found; worst ||c - w|| / ||w|| "
        f"{_fmt(trained['max_rel_err'])} (tolerance {_fmt(trained['tolerance'])}), "
        f"worst max|c - w| / max|w| {_fmt(trained['max_rel_diff'])}" + (f"; missing: {trained['missing']}" if trained["missing"] else ""),
        "",
        f"**Non-finite constants:** {verification['nonfinite_constants'] or 'none'}",
        "",
    ]
    lines += check_lines("Core ML prediction (macOS)", report["on_device"])
    placement = report["placement"]
    lines += ["## Placement", ""]
    if "skipped" in placement:
        lines += [f"skipped: {placement['skipped']}", ""]
    else:
        lines += ["| device | share of ops | share of estimated cost |", "|---|---|---|"]
        for device in sorted(set(placement["op_share"]) | set(placement["cost_share"])):
            lines.append(
                f"| {device} | {placement['op_share'].get(device, 0):.1%} | {placement['cost_share'].get(device, 0):.1%} |"
            )
        lines.append("")
    ready = report.get("readiness", {"skipped": "not computed"})
    lines += ["## ANE readiness", "", f"skipped: {ready['skipped']}", ""] if "skipped" in ready else markdown_lines(ready)
    lines += ["## Ops", "", "| op | count |", "|---|---|"]
    lines += [f"| {op} | {count} |" for op, count in report["ops"].items()]
    lines += ["", "## Weights", "", "| stored dtype | tensors | elements | bytes |", "|---|---|---|---|"]
    lines += [
        f"| {dtype} | {e['tensors']} | {e['elements']} | {e['bytes']} |" for dtype, e in weights["by_dtype"].items()
    ]
    if report["notes"]:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def write(report: dict, json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")


__all__ = ["interface", "markdown", "notes", "op_histogram", "package_bytes", "stored_weights", "write"]
