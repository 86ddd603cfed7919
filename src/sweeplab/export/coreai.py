"""Core AI export (`export.format=coreai`): the same exported program as Core ML's, converted to an `.aimodel` by
Apple's coreai-torch and checked by Apple's own runtime (coreai-core) in a child process.

Shared with Core ML (pipeline.py, convert.py): the loaded model and its export module, the example and verification
inputs, the metadata, `convert.trace` (torch.export with the family's dynamic sequence axis). Core AI's own part:
- the program is decomposed with `coreai_torch.get_decomp_table()` (Core ML's `{}` leaves conv1d, linear and
  layer_norm whole, which coreai-torch refuses) and converted in RELEASE mode (the default embeds the build
  machine's paths and stack traces);
- enumerated lengths (`export.seq_lens`) become one static function per length (`set_static_shape_config`:
  `main_s32`, `main_s64`, ...); a fixed length is the one function `main`;
- fp16 casts the exported graph (`coreai_opt.casting.cast_fp32_to_fp16`), keeping `export.fp32_layers` (node names
  of the decomposed program) in fp32; `fp32_layers=auto` keeps the nodes whose fp32 values leave fp16's range on
  the calibration inputs (the part of Core ML's readiness choice that maps onto a torch graph);
- int8 is coreai-opt's weight-only preset (`QuantizerConfig.presets.w8()`: per-channel symmetric int8 weights,
  fp32 activations), finalised for Core AI before the program is exported;
- metadata values are stored as strings (the runtime reads JSON numbers back as other types).

Verification (`verify_and_report`): Apple's runtime loads the saved asset in a child process (isolated.in_child:
a crash fails the check in one line, never the export; the model is released before the child exits, since a
process that ran a model may abort at interpreter exit otherwise) and runs every case against PyTorch. The asset
is checked first (`check_asset`): a directory that is not an .aimodel makes the runtime segfault, not raise.
On Linux that runtime is a CPU implementation: it checks fp32 programs exactly, and fp16 programs with fp16
accumulation (looser than a device: TOLERANCE_FP16_RUNTIME). Compute units are chosen when a device loads the
model, and per-op placement needs macOS 27: `on_device` is written against the public API and has never run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import hashlib
import io
import json
import logging
import platform
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sweeplab.core.errors import UserError, environment_error
from sweeplab.export import isolated, verify
from sweeplab.export.convert import INPUT_NAMES, dynamic_shapes, example_inputs, trace
from sweeplab.export.options import TOLERANCE_FP32, ExportOptions
from sweeplab.export.readiness import FP16_MAX
from sweeplab.export.report import check_lines, package_bytes, source_line

log = logging.getLogger(__name__)

SUFFIX = ".aimodel"
MINIMUM_OS = "27"  # iOS/macOS 27: the first with Core AI (coreai-core's default and only minimum_os)
# fp16 programs on the Linux runtime accumulate matmuls in fp16: 1.2e-2 relative error at the LM's "mini" width,
# against 1.3e-3 for PyTorch's own fp16 (issue #39's probe). A device's fp16 is not this; this is what Linux shows.
TOLERANCE_FP16_RUNTIME = 3e-2
CHILD_TIMEOUT_S = 1800.0
MACOS_FOR_DEVICE = (27, 0)
ERROR_MEASURES = verify.ERROR_MEASURES.replace("package output", "asset output")


# --- importing Apple's packages ------------------------------------------------------------------
_NOISY_LOGGERS = ("torch.utils._pytree", "torchao", "coreai_opt", "coreai_torch")


@contextlib.contextmanager
def _quiet():
    """coreai-torch warns that torch 2.13.0+cpu is untested (its check reads the local build tag as newer than
    2.13.0), coreai-opt and torchao warn about versions, CUDA kernels a CPU build lacks and batch norms a model does
    not have, and the converter draws a progress bar: none of it says anything about the export. Errors still show."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    errors_only = logging.Filter()
    errors_only.filter = lambda record: record.levelno >= logging.ERROR  # a filter: torch's log set-up resets levels
    try:
        for logger in loggers:
            logger.addFilter(errors_only)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(errors_only)


def _import(name: str):
    import importlib

    from sweeplab.export.coreai_env import missing

    if problem := missing():
        raise UserError(f"export.format=coreai: {problem}")
    with _quiet():
        return importlib.import_module(name)


# --- conversion ----------------------------------------------------------------------------------
@dataclass
class ConvertedAI:
    program: object  # coreai.authoring.AIProgram, not saved yet
    functions: dict[int, str]  # sequence length -> the function that takes it
    trace_s: float
    convert_s: float
    compress_s: float
    fp32_layers: list[str] = field(default_factory=list)  # nodes kept in fp32 in an fp16 program
    torch_program: object = None  # the exported program as converted (cast, quantized): run by PyTorch in the checks
    tracer: str = "torch.export"
    # the dtype each input takes (an fp16 program takes its float inputs, the decoder's embedding, as fp16)
    input_dtypes: dict[str, str] = field(default_factory=dict)

    def inputs(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: value.astype(self.input_dtypes.get(name, value.dtype), copy=False) for name, value in values.items()}


def convert(module: nn.Module, output_name: str, options: ExportOptions, seq_len: int, vocab_size: int,
            extra_inputs: Mapping[str, np.ndarray] | None = None, cases: list[verify.Case] | None = None) -> ConvertedAI:
    """`module` (forward(input_ids, attention_mask, *extra inputs) -> one tensor) as a Core AI program, as `options`
    say; `cases` calibrate `fp32_layers=auto`."""
    coreai_torch = _import("coreai_torch")
    module = module.eval()
    extra_inputs = dict(extra_inputs or {})
    example = (*example_inputs(options.batch_size, seq_len, vocab_size), *map(torch.from_numpy, extra_inputs.values()))
    start = time.perf_counter()
    compress_s = 0.0
    if options.compression == "int8":
        module = quantize_int8(module, example, options.seq_lens)
        compress_s = time.perf_counter() - start
    try:
        with _quiet():
            program, tracer, _ = trace(module, example, options.seq_lens, "export", coreai_torch.get_decomp_table())
    except UserError as exc:
        raise UserError(str(exc).replace("export.tracer=export", "export.format=coreai")) from None
    fp32_layers: list[str] = []
    if options.precision == "fp16":
        cast_start = time.perf_counter()
        program, fp32_layers = cast_fp16(program, options.fp32_layers, cases)
        compress_s += time.perf_counter() - cast_start
    traced = time.perf_counter()
    names = [*INPUT_NAMES, *extra_inputs]
    try:
        with _quiet():
            converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
            aiprogram = converter.add_exported_program(
                program, input_names=names, output_names=[output_name]
            ).to_coreai()
            if options.seq_lens:
                shapes = {n: (options.batch_size, n) for n in options.seq_lens}
                aiprogram.set_static_shape_config(
                    "main", {f"s{n}": {name: shape for name in INPUT_NAMES} for n, shape in shapes.items()}
                )
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"Core AI conversion ({options.variant}) failed: {first[:300]}") from exc
    functions = {n: f"main_s{n}" for n in options.seq_lens} if options.seq_lens else {seq_len: "main"}
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    input_dtypes = {
        name: str(torch.empty(0, dtype=placeholders[spec].meta["val"].dtype).numpy().dtype)
        for name, spec in zip(names, program.graph_signature.user_inputs)
    }
    return ConvertedAI(aiprogram, functions, traced - start - compress_s, time.perf_counter() - traced, compress_s,
                       fp32_layers, program, tracer, input_dtypes)


def quantize_int8(module: nn.Module, example: tuple, seq_lens: list[int] | None) -> nn.Module:
    """coreai-opt's weight-only int8 (per-channel symmetric): a graph module holding Core AI's quantized-weight ops."""
    quantization = _import("coreai_opt.quantization")
    with _quiet():
        quantizer = quantization.Quantizer(copy.deepcopy(module), quantization.QuantizerConfig.presets.w8())
        quantizer.prepare(example, dynamic_shapes=dynamic_shapes(example, seq_lens))
        return quantizer.finalize()


def _layers(program) -> list[str]:
    return [node.name for node in program.graph.nodes if node.op == "call_function"]


def cast_fp16(program, fp32_layers, cases: list[verify.Case] | None):
    """(the program cast to fp16 by coreai-opt, the layers kept in fp32). `fp32_layers`: node names of the decomposed
    program, or "auto" (`auto_fp32_layers`)."""
    casting = _import("coreai_opt.casting")
    if fp32_layers == "auto":
        keep = auto_fp32_layers(program, cases or [])
    else:
        keep = list(fp32_layers or [])
        known = set(_layers(program))
        unknown = [name for name in keep if name not in known]
        if unknown:
            raise UserError(
                f"export.fp32_layers: no layer named {unknown[0]!r} in the decomposed program (format=coreai names "
                f"torch.export nodes, e.g. {', '.join(sorted(known)[:6])})"
            )
    kept = set(keep)
    with _quiet():
        cast = casting.cast_fp32_to_fp16(copy.deepcopy(program), ignored_ops=lambda node: node.name in kept)
    return cast, keep


def auto_fp32_layers(program, cases: list[verify.Case]) -> list[str]:
    """`export.fp32_layers=auto` for Core AI: run the fp32 program in PyTorch on (up to two of) the calibration cases
    and keep in fp32 the nodes whose output leaves fp16's range (|x| > 65504; an exp whose input passes ln(65504) is
    one). Core ML's readiness choice also flags layers that add more than the tolerance against an fp32 twin and
    intermediates inside an op; those need its op-by-op evaluator and do not map onto a torch graph."""
    if not cases:
        raise UserError("export.fp32_layers=auto needs calibration inputs to find the layers: use export.verify=true")
    largest: dict[str, float] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            value = super().run_node(node)
            if node.op == "call_function" and isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                largest[node.name] = max(largest.get(node.name, 0.0), float(value.detach().abs().max()))
            return value

    graph_module = program.module()
    with torch.no_grad():
        for case in cases[:2]:
            inputs = [torch.from_numpy(value) for value in case.inputs.values()]
            Recorder(graph_module).run(*inputs)
    chosen = sorted(name for name, value in largest.items() if value > FP16_MAX)
    log.info("export.fp32_layers=auto: %s", ", ".join(chosen) if chosen else "no layer flagged; all fp16")
    return chosen


# --- saving and checking an asset ----------------------------------------------------------------
def save(converted: ConvertedAI, path: Path, shown: Path, *, author: str, description: str, version: str,
         metadata: Mapping[str, str]) -> None:
    """Save the program as an .aimodel at `path` with its metadata (every value a string); a full or unwritable disk
    is one UserError naming `shown` (the asset the user asked for)."""
    runtime = _import("coreai.runtime")
    meta = runtime.AIModelAssetMetadata()
    meta.author = author
    meta.model_description = description
    for key, value in {**metadata, "sweeplab.version": version}.items():
        meta.set_custom(key, str(value))
    try:
        with _quiet():
            converted.program.save_asset(path, meta)
    except (OSError, RuntimeError) as exc:
        os_error = next((e for e in (exc, exc.__cause__) if isinstance(e, OSError) and environment_error(e)), None)
        if os_error is None:
            raise
        raise UserError(f"cannot save {shown}: {os_error.strerror}") from None


def check_asset(path: str | Path) -> None:
    """A UserError (one line) unless `path` is a whole .aimodel: a directory with that suffix that Core AI's own
    validity check accepts, readable metadata, and a program whose bytes match the sha256 the asset stores. Runs
    before any load: the runtime segfaults on a directory that is not an asset, and a damaged one may crash it."""
    path = Path(path)
    if path.suffix != SUFFIX:
        raise UserError(f"{path}: not a Core AI asset (the name must end in {SUFFIX})")
    if not path.is_dir():
        raise UserError(f"{path}: not a Core AI asset ({'a file' if path.exists() else 'no such directory'})")
    authoring = _import("coreai.authoring")
    if not authoring.AIModelAsset.is_valid(path):
        raise UserError(f"{path}: not a valid Core AI asset (Core AI's validity check refused it)")
    try:
        json.loads((path / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: damaged Core AI asset: metadata.json unreadable ({exc})") from None
    program, digest = path / "main.mlirb", path / "main.hash"  # the layout coreai-core 1.0.0b3's save_asset writes
    if program.is_file() and digest.is_file() and hashlib.sha256(program.read_bytes()).digest() != digest.read_bytes():
        raise UserError(f"{path}: damaged Core AI asset: main.mlirb does not match its stored sha256 (main.hash)")


def describe_asset(path: Path) -> dict:
    """Functions with their inputs and outputs, stored scalar types, op counts and metadata, as the asset says."""
    authoring = _import("coreai.authoring")
    asset = authoring.AIModelAsset.load(path)
    summary = asset.summary(include_statistics=True)
    functions = {
        name: {"inputs": dict(summary.function_inputs(name)), "outputs": dict(summary.function_outputs(name))}
        for name in summary.function_names
    }
    return {
        "functions": functions,
        "storage_types": dict(summary.storage_types),
        "ops": dict(sorted(summary.operation_distribution, key=lambda item: -item[1])),
        "metadata": json.loads((path / "metadata.json").read_text(encoding="utf-8")),
    }


# --- running an asset (in a child process) -------------------------------------------------------
def run_functions(path: str, runs: list[tuple[str, dict]], output_name: str) -> list[np.ndarray]:
    """What the check's child process runs: Apple's runtime loads the asset at `path` and runs each (function name,
    inputs); the outputs as numpy arrays. The model and its functions are released before returning (a process
    that ran a model may abort at interpreter exit otherwise)."""
    check_asset(path)
    authoring = _import("coreai.authoring")
    runtime = _import("coreai.runtime")

    async def run_all() -> list[np.ndarray]:
        outputs = []
        async with authoring.AIModelAsset.load(path).executable() as model:
            functions = {}
            for name, inputs in runs:
                if name not in functions:
                    functions[name] = model.load_function(name)
                result = await functions[name]({k: runtime.NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()})
                outputs.append(np.array(result[output_name].numpy(), copy=True))
                del result
            functions.clear()
            del model
            gc.collect()
        return outputs

    with contextlib.redirect_stdout(sys.stderr):  # the runtime's "Loading function" lines stay off the result
        outputs = asyncio.run(run_all())
    gc.collect()
    return outputs


def on_device_macos(path: str, runs: list[tuple[str, dict]], output_name: str) -> dict:
    """macOS 27 only, and NEVER RUN (no macOS 27 where this was written): the asset loaded with the Neural Engine
    preferred (SpecializationOptions.from_preferred_compute_unit_kind), each run's output, and the per-op placement
    from coreai-torch's ComputePlan (a histogram of devices over the ops the plan places). Public API of coreai-core
    1.0.0b3 and coreai-torch 0.4.3 as documented in their docstrings."""
    check_asset(path)
    authoring = _import("coreai.authoring")
    runtime = _import("coreai.runtime")
    compute_plan = _import("coreai_torch.debugging.compute_plan")
    options = runtime.SpecializationOptions.from_preferred_compute_unit_kind(runtime.ComputeUnitKind.neural_engine())

    async def run_all() -> dict:
        model = await runtime.AIModel.load(path, options)
        outputs = []
        for name, inputs in runs:
            function = model.load_function(name)
            result = await function({k: runtime.NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()})
            outputs.append(np.array(result[output_name].numpy(), copy=True))
            del function, result
        del model
        asset = authoring.AIModelAsset.load(path)
        plan = await compute_plan.ComputePlan.from_program(asset.program, options)
        placement = plan.to_dict(asset.program)
        return {"outputs": outputs, "device_histogram": placement["device_histogram"],
                "entries": placement["entry_count"]}

    result = asyncio.run(run_all())
    gc.collect()
    return result


def why_not_on_device() -> str | None:
    """Why the macOS check cannot run here, or None (a Mac on macOS 27+ whose coreai-core uses the OS runtime)."""
    host = verify.host_macos()
    if host is None:
        return f"needs macOS {MACOS_FOR_DEVICE[0]} (Core AI on the device: Neural Engine load and placement); this is {sys.platform}"
    if host < MACOS_FOR_DEVICE:
        return f"needs macOS {MACOS_FOR_DEVICE[0]}+; this Mac runs macOS {'.'.join(map(str, host))}"
    runtime = _import("coreai.runtime")
    if not runtime.SpecializationOptions.is_supported():
        return "coreai-core uses its bundled runtime here: set USE_OS_COREAI=1 for the OS runtime (compute units)"
    return None


def in_child(target: Callable, *args, timeout: float = CHILD_TIMEOUT_S):
    """isolated.in_child for a function of this module (tests point it at other targets to crash it)."""
    return isolated.in_child(f"{target.__module__}:{target.__name__}", *args, timeout=timeout)


# --- verification and the report -----------------------------------------------------------------
def _runs(converted: ConvertedAI, cases: list[verify.Case]) -> list[tuple[str, dict]]:
    return [(converted.functions[case.input_ids.shape[1]], converted.inputs(case.inputs)) for case in cases]


def _runtime_check(path: Path, converted: ConvertedAI, output_name: str, cases, expected, tolerance: float,
                   runner: Callable | None = None) -> dict:
    """Apple's runtime on every case in a child process (`runner`: run_functions), against `expected`; a crash is a
    failed check."""
    try:
        outputs = in_child(runner or run_functions, str(path), _runs(converted, cases), output_name)
    except isolated.ChildFailed as exc:
        return {"passed": False, "error": f"Core AI runtime in a child process: {exc}", "tolerance": tolerance}
    results = iter(outputs)
    compared = verify.compare_cases(lambda inputs: {output_name: next(results)}, output_name, cases, expected, tolerance)
    compared["output_dtype"] = str(outputs[0].dtype) if outputs else None
    return compared


def _torch_check(converted: ConvertedAI, cases, expected, tolerance: float, output_name: str) -> dict:
    """The exported program as converted (the fp16 cast graph), run by PyTorch, against the fp32 model."""
    module = converted.torch_program.module()

    def run(inputs):
        with torch.no_grad():
            values = converted.inputs(inputs).values()
            return {output_name: module(*[torch.from_numpy(v) for v in values]).float().numpy()}

    return verify.compare_cases(run, output_name, cases, expected, tolerance)


def verify_and_report(staged: Path, target: Path, loaded, options: ExportOptions, converted: ConvertedAI, kind,
                      seq_len: int, cases: list[verify.Case], run_id: str | None, module: nn.Module,
                      extras: Mapping[str, np.ndarray], vocab_size: int) -> dict:
    """Check the saved asset and describe it: the report's dict (pipeline.py publishes it beside the asset)."""
    start = time.perf_counter()
    check_asset(staged)
    described = describe_asset(staged)
    checked, not_checked = [], []
    verification: dict = {"definition": ERROR_MEASURES}
    if not cases:
        verification["runtime"] = {"skipped": "export.verify=false"}
        not_checked.append("outputs against PyTorch (export.verify=false)")
    else:
        expected = verify.torch_outputs(loaded.model, cases)
        tolerance = options.verify_tolerance
        if options.precision == "fp16" and options.tolerance is None:
            tolerance = TOLERANCE_FP16_RUNTIME + (options.verify_tolerance if options.compression == "int8" else 0.0)
        verification["runtime"] = _runtime_check(staged, converted, kind.output, cases, expected, tolerance)
        what = f"{options.precision} asset" + (" (int8 weights)" if options.compression == "int8" else "")
        checked.append(f"the {what} on Apple's Core AI runtime (Linux CPU, child process) against the PyTorch "
                       f"model, every case, rel_err <= {tolerance:g}")
        if options.precision == "fp16":
            verification["runtime"]["note"] = (
                "the Linux runtime accumulates fp16 matmuls in fp16: its own tolerance "
                f"({TOLERANCE_FP16_RUNTIME:g}), not a device's numerics")
            verification["cast_graph"] = _torch_check(converted, cases, expected,
                                                      options.verify_tolerance, kind.output)
            checked.append(f"the fp16 cast graph run by PyTorch against the fp32 model, rel_err <= {options.verify_tolerance:g}")
            verification["fp32_twin"] = _fp32_twin(staged, module, kind.output, options, seq_len, vocab_size, extras,
                                                   cases, expected)
            if "skipped" not in verification["fp32_twin"]:
                checked.append(f"the same program converted in fp32, on Apple's runtime, rel_err <= {TOLERANCE_FP32:g} "
                               "(the conversion itself, apart from fp16)")
    verification["seconds"] = time.perf_counter() - start
    if (reason := why_not_on_device()) is not None:
        on_device = {"skipped": reason}
        placement = {"skipped": f"per-op placement (ComputePlan, the Core AI debugger, Instruments): {reason}"}
        not_checked += [f"Neural Engine load and outputs on a device: {reason}",
                        f"per-op placement: {reason}"]
    else:  # macOS 27: written against the public API, never run
        on_device, placement = _on_device(staged, converted, kind.output, cases, expected if cases else [], options)
    not_checked.append("the trained tensors among the asset's constants (Core ML's weight check reads .mlpackage "
                       "programs); the fp32 runtime comparison against the trained model stands for it")
    not_checked.append("Core ML's ANE readiness report (op census, fp16 range per op): .mlpackage only")
    failures = _failures(verification, on_device)
    runtime = verification["runtime"]
    summary = ("not verified" if "skipped" in runtime else
               f"rel_err {runtime['rel_err']:.2e} (tolerance {runtime['tolerance']:.0e}, Apple's runtime on Linux)"
               if "rel_err" in runtime else runtime.get("error", "runtime check failed"))
    return {
        "package": str(target),
        "format": "coreai",
        "status": "failed" if failures else "passed",
        "failure": "; ".join(failures),
        "summary": summary,
        "variant": options.variant,
        "source": {"family": loaded.family, "checkpoint": str(loaded.path), "global_step": loaded.global_step,
                   "run_id": run_id},
        "options": asdict(options),
        "conversion": _conversion_record(converted, seq_len),
        "interface": described["functions"],
        "metadata": described["metadata"],
        "ops": described["ops"],
        "weights": {"by_dtype": described["storage_types"], "package_bytes": package_bytes(staged)},
        "verification": verification,
        "on_device": on_device,
        "placement": placement,
        "readiness": {"skipped": "Core ML's ANE readiness report reads .mlpackage programs; not computed for .aimodel"},
        "checked": checked,
        "not_checked": not_checked,
    }


def _conversion_record(converted: ConvertedAI, seq_len: int) -> dict:
    """How the asset was converted: the report's "conversion" section."""
    return {
        "tracer": converted.tracer,
        "decompositions": "coreai_torch.get_decomp_table()",
        "mode": "release",
        "minimum_os": MINIMUM_OS,
        "trace_s": converted.trace_s,
        "convert_s": converted.convert_s,
        "compress_s": converted.compress_s,
        "seq_len": seq_len,
        "functions": {str(n): name for n, name in converted.functions.items()},
        "fp32_layers": converted.fp32_layers,
        "input_dtypes": converted.input_dtypes,
        "versions": versions(),
    }


def _fp32_twin(staged: Path, module, output: str, options: ExportOptions, seq_len: int, vocab_size: int, extras,
               cases, expected) -> dict:
    """An fp16 export's fp32 counterpart, converted and saved beside the staged asset and run on the runtime: what the
    conversion alone costs. With int8 weights the twin keeps them, so it checks against the int8 tolerance."""
    from dataclasses import replace

    twin_options = replace(options, precision="fp32", fp32_layers=None)
    twin = convert(module, output, twin_options, seq_len, vocab_size, extras)
    path = staged.with_name("fp32-twin" + SUFFIX)
    save(twin, path, path, author="sweeplab", description="fp32 twin", version="0", metadata={})
    tolerance = twin_options.verify_tolerance
    return _runtime_check(path, twin, output, cases, expected, tolerance)


def _on_device(staged: Path, converted: ConvertedAI, output: str, cases, expected, options) -> tuple[dict, dict]:
    """macOS 27 only, never run here: the Neural-Engine-preferred load and placement, in a child process."""
    try:
        result = in_child(on_device_macos, str(staged), _runs(converted, cases), output)
    except isolated.ChildFailed as exc:
        error = {"passed": False, "error": f"Core AI on the device (Neural Engine preferred) in a child process: {exc}"}
        return error, {"skipped": "the device load failed"}
    results = iter(result["outputs"])
    compared = verify.compare_cases(lambda inputs: {output: next(results)}, output, cases, expected,
                                    options.verify_tolerance)
    placement = {"device_histogram": result["device_histogram"], "entries": result["entries"],
                 "compute_units": "neural_engine preferred"}
    return {**compared, "compute_units": "neural_engine preferred"}, placement


def _failures(verification: dict, on_device: dict) -> list[str]:
    failures = []
    for name, check in verification.items():
        if not isinstance(check, dict) or "skipped" in check or "passed" not in check or check["passed"]:
            continue
        if "error" in check:
            failures.append(check["error"])
        elif check["nonfinite"]:
            failures.append(f"{name}: {check['nonfinite']} NaN/Inf in the outputs")
        else:
            failures.append(f"{name}: rel_err {check['rel_err']:.3g} > tolerance {check['tolerance']:.3g}")
    if "skipped" not in on_device and not on_device.get("passed", False):
        failures.append(on_device.get("error") or f"on device: rel_err {on_device['rel_err']:.3g}")
    return failures


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {
        **{dist: version(dist) for dist in ("coreai-torch", "coreai-core", "coreai-opt")},
        "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
    }


# --- the report as Markdown ----------------------------------------------------------------------
def markdown(report: dict) -> str:
    src, conv = report["source"], report["conversion"]
    lines = [
        f"# Core AI export: {Path(report['package']).name} ({report['status']})",
        "",
        source_line(src),
        f"- variant: {report['variant']}, minimum OS {conv['minimum_os']}, converted in {conv['mode']} mode from a "
        f"torch.export program decomposed with {conv['decompositions']}",
        f"- functions: {', '.join(f'{name} (S={n})' for n, name in conv['functions'].items())}",
        f"- fp32 layers in fp16: {', '.join(conv['fp32_layers']) or 'none'}",
        f"- time: trace {conv['trace_s']:.2f} s, convert {conv['convert_s']:.2f} s, compress/cast {conv['compress_s']:.2f} s, "
        f"verify {report['verification'].get('seconds', 0):.2f} s",
        f"- asset: {report['weights']['package_bytes'] / 1e6:.3f} MB; versions: "
        + ", ".join(f"{k} {v}" for k, v in conv["versions"].items()),
        "",
        "## What was checked",
        "",
        *([f"- {line}" for line in report["checked"]] or ["- nothing"]),
        "",
        "## What was not checked",
        "",
        *[f"- {line}" for line in report["not_checked"]],
        "",
        "## Verification",
        "",
        report["verification"]["definition"],
        "",
    ]
    verification = report["verification"]
    lines += check_lines("Apple's Core AI runtime (Linux CPU)", verification["runtime"])
    if "cast_graph" in verification:
        lines += check_lines("fp16 cast graph in PyTorch", verification["cast_graph"])
    if "fp32_twin" in verification:
        lines += check_lines("fp32 twin on Apple's runtime", verification["fp32_twin"])
    lines += check_lines("Core AI on the device (Neural Engine preferred, macOS 27)", report["on_device"])
    placement = report["placement"]
    lines += ["## Placement", ""]
    lines += ([f"skipped: {placement['skipped']}", ""] if "skipped" in placement else
              [f"{device}: {count} ops" for device, count in placement["device_histogram"].items()] + [""])
    lines += ["## Interface", "", "| function | name | kind | type |", "|---|---|---|---|"]
    for function, io_ in report["interface"].items():
        for kind in ("inputs", "outputs"):
            lines += [f"| {function} | {name} | {kind[:-1]} | {text} |" for name, text in io_[kind].items()]
    lines += ["", "## Ops", "", "| op | count |", "|---|---|"]
    lines += [f"| {op} | {count} |" for op, count in report["ops"].items()]
    lines += ["", "## Stored scalars", "", "| type | count |", "|---|---|"]
    lines += [f"| {dtype} | {count} |" for dtype, count in report["weights"]["by_dtype"].items()]
    return "\n".join(lines) + "\n"


def write_report(report: dict, json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")


__all__ = [
    "ConvertedAI", "SUFFIX", "TOLERANCE_FP16_RUNTIME", "check_asset", "convert", "describe_asset", "on_device_macos",
    "run_functions", "save", "verify_and_report", "write_report",
]
