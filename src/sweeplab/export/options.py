"""The `export` config group as a dataclass: what a Core ML or Core AI export does, validated before any work starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval

from sweeplab.core.config import build

SUFFIXES = {"coreml": ".mlpackage", "coreai": ".aimodel"}
# coremltools 9 allows EnumeratedShapes on more than one input only from these targets on
ENUMERATED_SHAPES_TARGETS = ("iOS18", "macOS15")

# Verification thresholds on max|package - torch| / max|torch| (see verify.py), by variant.
TOLERANCE_FP32 = 1e-4
TOLERANCE_FP16 = 1e-2
TOLERANCE_INT8 = 5e-2  # per-channel symmetric int8 weights on top of fp16 compute


# n-bit palettes (k-means, per tensor), measured on the smoke-trained LM (rel_err of the logits, ||Δw|| / ||w||):
# 8 bits 0.012 / 0.006, 6 bits 0.072 / 0.025, 4 bits 0.20 / 0.10, 2 bits 0.53 / 0.35, 1 bit 0.82 / 0.61; a weight
# tensor that was re-initialised instead of loaded is >= 1.1 away. Below 4 bits the output check only proves that
# the package runs and stays finite.
PALETTIZE_TOLERANCE = {8: 0.05, 6: 0.2, 4: 0.5, 2: 1.0, 1: 2.0}
PALETTIZE_WEIGHT_TOLERANCE = {8: 0.03, 6: 0.08, 4: 0.25, 2: 0.6, 1: 0.9}


@dataclass
class ExportOptions:
    # every value's bounds are declared on its annotation (core.config reads them, before any import: one place)
    format: Literal["coreml", "coreai", "none"] = "coreml"  # .mlpackage | .aimodel (export/coreai.py) | `export=none`
    precision: Literal["fp16", "fp32"] = "fp16"  # compute precision: fp16 (the Neural Engine's) | fp32 (never on it)
    deployment_target: Literal["iOS16", "iOS17", "iOS18", "macOS13", "macOS14", "macOS15"] = "iOS17"  # the minimum
    layout: Literal["standard", "ane"] = "standard"  # ane: (B, C, 1, S), 1x1 convs, channel LayerNorm, per-head attention
    compression: Literal["none", "int8", "palettize"] = "none"  # int8 (linear, per channel) | palettize (n-bit table)
    nbits: Literal[1, 2, 4, 6, 8] = 6  # palettize: bits per weight (lookup tables of 2 to 256 entries, iOS16+)
    palettize_mode: Literal["kmeans", "uniform"] = "kmeans"
    weight_threshold: Annotated[int, Ge(0)] = 2048  # compress only weights with more elements than this
    # the package's fixed batch; bounded: the checks allocate batch x context inputs and outputs (1e8 asked 95 GiB)
    batch_size: Annotated[int, Interval(ge=1, le=4096)] = 1
    seq_len: Annotated[int, Ge(1)] | None = None  # static sequence length; null: the model's context (max_len / block_size)
    seq_lens: list[int] | None = None  # EnumeratedShapes over these lengths (seq_len is the default shape)
    tracer: Literal["auto", "export", "jit"] = "auto"  # auto (torch.export, then torch.jit.trace) | export | jit
    name: str | None = None  # package name; null: <family>-<layout>-<precision>[-<compression>]
    author: str = "sweeplab"
    description: str | None = None
    version: str | None = None  # null: the checkpoint's global step
    overwrite: bool = False
    verify: bool = True  # run the package with the reference evaluator and compare with PyTorch
    n_random: Annotated[int, Ge(1)] = 4  # random input batches per verification
    real_data: str | None = None  # TextBridge: a dataset (JSONL/EFB1/dir); LM: a token .bin file
    n_real: Annotated[int, Ge(0)] = 4  # real input batches
    tolerance: Annotated[float, Gt(0)] | None = None  # null: by variant (fp32 1e-4, fp16 1e-2, int8 5e-2, PALETTIZE_TOLERANCE)
    seed: int = 0
    readiness: bool = True  # the ANE readiness report (readiness.py): op census, fp16 range, fp16 against fp32
    # layers (op names from the readiness report) kept in fp32 in an fp16 export; auto: the layers the readiness report
    # of a plain fp16 conversion flags (fp16 overflow, or adding more than the tolerance against fp32)
    fp32_layers: list[str] | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        """What one value's bounds cannot say (how values combine); the bounds are on the annotations."""
        if self.format == "coreai":
            self._check_coreai()
        if self.seq_lens is not None:
            self.seq_lens = sorted({int(n) for n in self.seq_lens})
            if not self.seq_lens or self.seq_lens[0] < 2:
                raise ValueError(f"seq_lens must be lengths >= 2, got {self.seq_lens}")
            if self.format == "coreml" and self.deployment_target not in ENUMERATED_SHAPES_TARGETS:
                raise ValueError(
                    f"seq_lens (EnumeratedShapes on both inputs) needs deployment_target "
                    f"{' or '.join(ENUMERATED_SHAPES_TARGETS)}; got {self.deployment_target}"
                )
            if self.seq_len is not None and self.seq_len not in self.seq_lens:
                raise ValueError(f"seq_len={self.seq_len} is not one of seq_lens={self.seq_lens}")
        if self.name is not None and ("/" in self.name or self.name.strip(". ") == ""):
            raise ValueError(f"name={self.name!r} must be a file name (no '/'), e.g. textbridge-ane")
        if self.fp32_layers is not None:
            if isinstance(self.fp32_layers, str) and self.fp32_layers != "auto":
                raise ValueError(f"fp32_layers must be a list of layer names or auto, got {self.fp32_layers!r}")
            if self.fp32_layers != "auto":
                self.fp32_layers = [str(name) for name in self.fp32_layers]
            if self.precision != "fp16":
                raise ValueError("fp32_layers needs precision=fp16 (an fp32 program keeps every layer in fp32)")
            if any(not name.strip() for name in self.fp32_layers):
                raise ValueError(f"fp32_layers must be layer names, got {self.fp32_layers}")

    def _check_coreai(self) -> None:
        """What the Core AI path does not take (export/coreai.py): the rest of the options mean the same for both."""
        if self.compression == "palettize":
            raise ValueError("compression=palettize is Core ML only; with format=coreai use none or int8")
        if self.tracer == "jit":
            raise ValueError("tracer=jit is Core ML only; format=coreai converts torch.export programs (tracer=auto)")

    @property
    def suffix(self) -> str:
        """The file name suffix of what the export writes: .mlpackage or .aimodel."""
        return SUFFIXES.get(self.format, SUFFIXES["coreml"])

    @property
    def enabled(self) -> bool:
        return self.format != "none"

    @property
    def variant(self) -> str:
        """layout-precision[-compression], e.g. ane-fp16-int8; the default package name follows it."""
        parts = [self.layout, self.precision]
        if self.compression == "int8":
            parts.append("int8")
        elif self.compression == "palettize":
            parts.append(f"pal{self.nbits}")
        return "-".join(parts)

    @property
    def verify_tolerance(self) -> float:
        if self.tolerance is not None:
            return self.tolerance
        if self.compression == "int8":
            return TOLERANCE_INT8
        if self.compression == "palettize":
            return PALETTIZE_TOLERANCE[self.nbits]
        return TOLERANCE_FP32 if self.precision == "fp32" else TOLERANCE_FP16

    @property
    def weight_tolerance(self) -> float:
        """How far a stored weight tensor may be from the checkpoint's: ||c - w|| / ||w|| (see verify.check_weights)."""
        if self.compression == "int8":
            return 2e-2  # measured 7e-3
        if self.compression == "palettize":
            return PALETTIZE_WEIGHT_TOLERANCE[self.nbits]
        return 1e-6 if self.precision == "fp32" else 1e-3  # fp16 rounds by <= 2^-11 of each value


def options_from_config(values: Mapping | None) -> ExportOptions:
    """The `export` config group (a plain mapping or a DictConfig; None or empty: no export), validated.

    Cheap (no coremltools import): the training app can call it while planning, so `export.precision=fp8`
    fails before any training starts.
    """
    from omegaconf import DictConfig, OmegaConf

    if isinstance(values, DictConfig):
        values = OmegaConf.to_container(values, resolve=True)
    options = build(ExportOptions, dict(values or {"format": "none"}), "export")
    if options.format == "coreai":  # the extra is checked here, so the training app refuses before any training
        from sweeplab.core.errors import ConfigError
        from sweeplab.export.coreai_env import missing

        if problem := missing():
            raise ConfigError("export.format=coreai", problem)
    return options


__all__ = ["ExportOptions", "options_from_config", "PALETTIZE_TOLERANCE", "PALETTIZE_WEIGHT_TOLERANCE"]
