"""PyTorch module -> Core ML ML Program: trace, convert, compress weights, describe. Nothing here touches the disk.

Tracing: `torch.export` followed by `run_decompositions({})` (coremltools 9 needs the decomposed program), and
`torch.jit.trace` when that fails. coremltools 9.0's converter bugs that our models hit are fixed in ct_fixes.py.
fp16 programs turn a `finfo(float32).min` mask into -inf and NaN: the models mask with -1e4 (models/gpt.py), and
`nonfinite_constants` lets the report prove that no infinite constant reached the package.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from sweeplab.core.errors import UserError
from sweeplab.export import ct_fixes
from sweeplab.export.options import ExportOptions
from sweeplab.export.reference import import_coremltools

log = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask")
# The converter names each op after its torch.export node ("linear_0", "exp", "sum_1") and its precision passes append
# "_cast_fp16", "_cast_uint16", ... to the op's name in the saved program; a layer is that name without the suffixes,
# which is also the name FP16ComputePrecision's op_selector sees (so `export.fp32_layers` takes what the report shows).
_CAST_SUFFIX = re.compile(r"(_cast_(fp16|fp32|uint16|int16|int32|uint8|int8|bool))+$")


def layer_name(op_name: str) -> str:
    return _CAST_SUFFIX.sub("", op_name)


@dataclass
class Converted:
    mlmodel: object  # coremltools.models.MLModel, not saved yet
    tracer: str  # "torch.export" | "torch.jit.trace"
    trace_s: float
    convert_s: float
    compress_s: float
    fallback_reason: str | None = None


def example_inputs(batch_size: int, seq_len: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator, dtype=torch.int32)
    return input_ids, torch.ones(batch_size, seq_len, dtype=torch.int32)


def dynamic_shapes(example: tuple, seq_lens: list[int] | None):
    """torch.export's dynamic_shapes for `example`: the sequence axis of the two token inputs spans `seq_lens`."""
    if not seq_lens:
        return None
    seq = torch.export.Dim("seq_len", min=min(seq_lens), max=max(seq_lens))
    return ({1: seq}, {1: seq}, *(None for _ in example[2:]))


def trace(module: nn.Module, example: tuple, seq_lens: list[int] | None, tracer: str, decompositions: dict | None = None):
    """(traced program, tracer name, why torch.export was not used or None). `example`: input_ids, attention_mask,
    then any extra inputs (of one fixed shape each). `decompositions`: the table the exported program is decomposed
    with (Core ML: none, `{}`; Core AI: `coreai_torch.get_decomp_table()`)."""
    fallback_reason = None
    if tracer in ("auto", "export"):
        try:
            program = torch.export.export(module, example, dynamic_shapes=dynamic_shapes(example, seq_lens), strict=False)
            program = program.run_decompositions({} if decompositions is None else decompositions)
            return program, "torch.export", None
        except Exception as exc:  # any failure of torch.export: the documented fallback is jit.trace
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if tracer == "export":
                raise UserError(f"export.tracer=export: torch.export failed: {first}") from None
            fallback_reason = f"torch.export failed: {first[:300]}"
            log.warning("%s; falling back to torch.jit.trace", fallback_reason)
    with torch.no_grad():
        traced = torch.jit.trace(module, example, check_trace=False)
    return traced, "torch.jit.trace", fallback_reason


def _input_types(ct, options: ExportOptions, seq_len: int, extra_inputs: Mapping[str, np.ndarray]):
    if options.seq_lens:
        shape = ct.EnumeratedShapes(
            shapes=[(options.batch_size, n) for n in options.seq_lens], default=(options.batch_size, seq_len)
        )
    else:
        shape = (options.batch_size, seq_len)
    return [ct.TensorType(name=name, shape=shape, dtype=np.int32) for name in INPUT_NAMES] + [
        ct.TensorType(name=name, shape=value.shape, dtype=np.float32) for name, value in extra_inputs.items()
    ]


def deployment_target(ct, name: str):
    return getattr(ct.target, name)


def convert(
    module: nn.Module, output_name: str, options: ExportOptions, seq_len: int, vocab_size: int,
    extra_inputs: Mapping[str, np.ndarray] | None = None,
) -> Converted:
    """Trace `module` (forward(input_ids, attention_mask, *extra inputs) -> one tensor) and convert it to an ML
    Program. `extra_inputs`: example values of the float32 inputs after the two token inputs, by name, in order."""
    ct = import_coremltools()
    ct_fixes.install()
    ct_logger = logging.getLogger("coremltools")
    if ct_logger.level == logging.NOTSET:  # it logs every graph pass at INFO; keep its warnings
        ct_logger.setLevel(logging.WARNING)
    module = module.eval()
    extra_inputs = dict(extra_inputs or {})
    example = (*example_inputs(options.batch_size, seq_len, vocab_size), *map(torch.from_numpy, extra_inputs.values()))
    start = time.perf_counter()
    program, tracer, fallback_reason = trace(module, example, options.seq_lens, options.tracer)
    traced = time.perf_counter()
    precision, layers_seen = _compute_precision(ct, options)
    try:
        with _quiet_converter():
            mlmodel = ct.convert(
                program,
                inputs=_input_types(ct, options, seq_len, extra_inputs),
                outputs=[ct.TensorType(name=output_name)],
                convert_to="mlprogram",
                compute_precision=precision,
                minimum_deployment_target=deployment_target(ct, options.deployment_target),
                skip_model_load=True,  # loading compiles the model: macOS only, and not needed to save it
            )
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"Core ML conversion ({tracer}, {options.variant}, {options.deployment_target}) failed: {first[:300]}"
        ) from exc
    converted = time.perf_counter()
    _check_fp32_layers(options.fp32_layers or [], layers_seen)
    mlmodel = compress(mlmodel, options)
    return Converted(
        mlmodel, tracer, traced - start, converted - traced, time.perf_counter() - converted, fallback_reason
    )


def _compute_precision(ct, options: ExportOptions):
    """(coremltools compute_precision, the layer names its fp16 pass visited): `export.fp32_layers` as an op_selector
    (coremltools' per-op precision: ct.transform.FP16ComputePrecision) that leaves the named layers in fp32."""
    if options.precision == "fp32":
        return ct.precision.FLOAT32, set()
    if not options.fp32_layers:
        return ct.precision.FLOAT16, set()
    keep, seen = set(options.fp32_layers), set()

    def to_fp16(op) -> bool:
        if op.op_type != "const":
            seen.add(op.name)
        return op.name not in keep

    return ct.transform.FP16ComputePrecision(op_selector=to_fp16), seen


def _check_fp32_layers(requested: list[str], seen: set[str]) -> None:
    unknown = [name for name in requested if name not in seen]
    if unknown:
        examples = ", ".join(sorted(seen)[:6])
        raise UserError(
            f"export.fp32_layers: no layer named {unknown[0]!r} in the converted program "
            f"(layer names are the readiness report's, e.g. {examples})"
        )


@contextlib.contextmanager
def _quiet_converter():
    """coremltools 9.0 draws a progress bar per graph pass (no switch: its modules call tqdm directly) and its
    value-range pass warns about float overflow in its own arithmetic; neither says anything about the export."""
    from functools import partial

    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.mil.passes import pass_pipeline

    bars = {pass_pipeline: "tqdm", ops: "_tqdm"}
    originals = {module: getattr(module, name) for module, name in bars.items()}
    try:
        for module, name in bars.items():
            setattr(module, name, partial(originals[module], disable=True))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)
            yield
    finally:
        for module, name in bars.items():
            setattr(module, name, originals[module])


def compress(mlmodel, options: ExportOptions):
    """Weight compression with coremltools.optimize.coreml (runs on Linux; activations stay as they are)."""
    if options.compression == "none":
        return mlmodel
    from coremltools.optimize import coreml as cto

    if options.compression == "int8":
        op_config = cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel", weight_threshold=options.weight_threshold
        )
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op_config))
    op_config = cto.OpPalettizerConfig(
        mode=options.palettize_mode, nbits=options.nbits, granularity="per_tensor", weight_threshold=options.weight_threshold
    )
    return cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=op_config))


def describe(mlmodel, *, author: str, description: str, version: str, metadata: Mapping[str, str],
             inputs: Mapping[str, str], outputs: Mapping[str, str]) -> None:
    """Package metadata: author, description, version, user-defined keys, and a line per input and output."""
    mlmodel.author = author
    mlmodel.short_description = description
    mlmodel.version = version
    mlmodel.user_defined_metadata.update({key: str(value) for key, value in metadata.items()})
    for name, text in inputs.items():
        mlmodel.input_description[name] = text
    for name, text in outputs.items():
        mlmodel.output_description[name] = text


def nonfinite_constants(weights: Mapping[str, np.ndarray]) -> list[str]:
    """Names of constant tensors holding inf or NaN (a -inf mask that survived into the package, for example)."""
    return [name for name, value in weights.items() if value.dtype.kind == "f" and not np.isfinite(value).all()]


__all__ = [
    "Converted", "INPUT_NAMES", "convert", "compress", "describe", "dynamic_shapes", "example_inputs", "nonfinite_constants",
    "trace",
]
