"""The Linux reference evaluator: run a saved .mlpackage without Core ML, op by op, in numpy.

The package's spec is loaded back into a MIL program with coremltools' milproto loader, and each operation is
evaluated with coremltools' own `value_inference()` (the numpy definition of the op that its converter uses for
constant folding). Ops without one are implemented here: `conv`, `silu`, `batch_norm`, `instance_norm`, and the
compression ops (`constexpr_*`, through their `materialized_val_inference()`). An op that is in neither set stops the run with its name, never a
silent wrong answer.

Numerics (say it when quoting errors): every op computes in float32 from its inputs (fp16 values widened exactly)
and its output is rounded to the dtype the program declares for it. So an fp16 program is modelled as fp16 storage
between ops with float32 arithmetic inside each op; a device that also keeps intermediates of one op (a layer_norm's
variance, a matmul's accumulator) in fp16 can differ by more than this model shows.

Private API: `coremltools.converters.mil.frontend.milproto.load`, `Var._sym_val` and the op classes' inference
methods are internal to coremltools. pyproject.toml pins coremltools==9.0 and tests/test_export_reference.py pins
their behaviour op by op.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sweeplab.core.errors import UserError

COMPRESSION_OP_PREFIX = "constexpr_"
Observer = Callable[[object, tuple], None]  # (MIL op, its outputs before rounding) -> None


def import_coremltools():
    """coremltools logs a line per missing macOS proxy (and untested torch/sklearn versions) when imported on
    Linux; that noise tells users nothing, so the import runs with its logger and the console muted."""
    ct_logger = logging.getLogger("coremltools")
    level = ct_logger.level
    ct_logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import coremltools  # noqa: F401
            from coremltools.converters.mil.frontend.milproto import load  # noqa: F401
    finally:
        ct_logger.setLevel(level)
    import coremltools as ct

    return ct


def package_spec(path: str | Path):
    """(spec, weights dir) of a saved .mlpackage; a clear UserError when it is not one."""
    ct = import_coremltools()
    path = Path(path)
    if not (path / "Manifest.json").is_file():
        raise UserError(f"{path}: not a Core ML package (no Manifest.json)")
    model = ct.models.MLModel(str(path), skip_model_load=True)
    return model.get_spec(), model.weights_dir


# --- ops coremltools has no value_inference for --------------------------------------------------
def _conv_pads(op, x: np.ndarray, kernel: tuple[int, ...], strides, dilations) -> list[tuple[int, int]]:
    pad_type = op.pad_type.val if op.pad_type is not None else "valid"
    spatial = x.shape[2:]
    if pad_type == "valid":
        return [(0, 0)] * len(kernel)
    if pad_type == "custom":
        pad = [int(p) for p in op.pad.val]
        return [(pad[2 * i], pad[2 * i + 1]) for i in range(len(kernel))]
    if pad_type in ("same", "same_lower"):
        pads = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            pads.append((small, large) if pad_type == "same" else (large, small))
        return pads
    raise NotImplementedError(f"conv pad_type={pad_type!r}")


def conv(op) -> np.ndarray:
    """MIL `conv` (1-, 2- or 3-D, groups, strides, dilations, every pad_type) as windows times weights."""
    x = np.asarray(op.x.val, dtype=np.float32)
    weight = np.asarray(op.weight.val, dtype=np.float32)
    n_spatial = x.ndim - 2
    kernel = weight.shape[2:]
    strides = [int(s) for s in op.strides.val] if op.strides is not None else [1] * n_spatial
    dilations = [int(d) for d in op.dilations.val] if op.dilations is not None else [1] * n_spatial
    groups = int(op.groups.val) if op.groups is not None else 1
    pads = _conv_pads(op, x, kernel, strides, dilations)
    x = np.pad(x, [(0, 0), (0, 0), *pads])
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    windows = sliding_window_view(x, extent, axis=tuple(range(2, 2 + n_spatial)))  # (N, C, *out_full, *extent)
    picks = (slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dilations))
    windows = windows[picks]  # (N, C, *out, *kernel)
    n, channels = windows.shape[:2]
    out_shape = windows.shape[2 : 2 + n_spatial]
    c_out = weight.shape[0]
    per_group_in, per_group_out = channels // groups, c_out // groups
    cols = windows.reshape(n, groups, per_group_in, int(np.prod(out_shape)), int(np.prod(kernel)))
    kernels = weight.reshape(groups, per_group_out, per_group_in, int(np.prod(kernel)))
    out = np.einsum("ngcpk,gock->ngop", cols, kernels, optimize=True).reshape(n, c_out, *out_shape)
    if op.bias is not None:
        out = out + np.asarray(op.bias.val, dtype=np.float32).reshape(1, c_out, *([1] * n_spatial))
    return out


def silu(op) -> np.ndarray:
    x = np.asarray(op.x.val, dtype=np.float32)
    return x / (1.0 + np.exp(-x))


def _channel_param(op, name: str, rank: int, default: float) -> np.ndarray | float:
    var = getattr(op, name)
    if var is None:
        return default
    return np.asarray(var.val, dtype=np.float32).reshape(1, -1, *([1] * (rank - 2)))


def batch_norm(op) -> np.ndarray:
    """MIL `batch_norm` (inference): per-channel (axis 1) (x - mean) / sqrt(variance + eps) * gamma + beta.

    coremltools folds a per-channel scale and shift that follows a channel-axis layer_norm into this op.
    """
    x = np.asarray(op.x.val, dtype=np.float32)
    mean = _channel_param(op, "mean", x.ndim, 0.0)
    variance = _channel_param(op, "variance", x.ndim, 1.0)
    epsilon = float(op.epsilon.val) if op.epsilon is not None else 1e-5
    out = (x - mean) / np.sqrt(variance + epsilon)
    return out * _channel_param(op, "gamma", x.ndim, 1.0) + _channel_param(op, "beta", x.ndim, 0.0)


def instance_norm(op) -> np.ndarray:
    """MIL `instance_norm`: normalise each (sample, channel) over the spatial axes, then per-channel gamma/beta."""
    x = np.asarray(op.x.val, dtype=np.float32)
    axes = tuple(range(2, x.ndim))
    epsilon = float(op.epsilon.val) if op.epsilon is not None else 1e-5
    centered = x - x.mean(axis=axes, keepdims=True)
    out = centered / np.sqrt((centered**2).mean(axis=axes, keepdims=True) + epsilon)
    return out * _channel_param(op, "gamma", x.ndim, 1.0) + _channel_param(op, "beta", x.ndim, 0.0)


CUSTOM_OPS: dict[str, Callable] = {"conv": conv, "silu": silu, "batch_norm": batch_norm, "instance_norm": instance_norm}


# --- the evaluator -------------------------------------------------------------------------------
def _numpy_dtype(var) -> np.dtype:
    from coremltools.converters.mil.mil import types

    return np.dtype(types.nptype_from_builtin(var.dtype))


def _bind(var, value) -> None:
    """Give `var` a value that the op classes' inference methods read as `var.val`.

    Tensor and number holders keep their value in `_val` behind a `val` property whose setter would cast a widened
    fp16 value back to fp16, so `_val` is written directly; the bool holder has a plain `val` attribute.
    """
    holder = var.sym_type()
    if isinstance(getattr(type(holder), "val", None), property):
        holder._val = value
    else:
        holder.val = value
    var._sym_val = holder


def _python_scalar_flags(program) -> None:
    """numpy >= 2 refuses a numpy bool as `keepdims=` (reduce_* ops): give const bool scalars Python bools."""
    for op in program.functions["main"].operations:
        for arg in op.inputs.values():
            for var in arg if isinstance(arg, (list, tuple)) else (arg,):
                if isinstance(var.val, np.bool_):
                    var._sym_val.val = bool(var.val)


def _widen(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float32) if isinstance(value, np.ndarray) and value.dtype == np.float16 else value


class ReferenceProgram:
    """A saved package's main function, ready to evaluate on numpy inputs.

    A program with flexible input shapes (EnumeratedShapes) is evaluated at each concrete input shape the model
    description allows: the spec is loaded again with those shapes, so every op's type is static as it is on a
    device that picked that shape (coremltools' value_inference() reads static shapes).
    """

    def __init__(self, path: Path, spec, weights_dir: str):
        self.path = Path(path)
        self.spec = spec
        self.weights_dir = weights_dir
        self.program = self._load(spec)
        self._specialised: dict[tuple, object] = {}

    def _load(self, spec):
        from coremltools.converters.mil.frontend.milproto import load as milproto

        program = milproto.load(spec, spec.specificationVersion, self.weights_dir)
        _python_scalar_flags(program)
        return program

    @property
    def function(self):
        return self.program.functions["main"]

    @property
    def input_names(self) -> list[str]:
        return list(self.function.inputs)

    @property
    def output_names(self) -> list[str]:
        return [var.name for var in self.function.outputs]

    def allowed_shapes(self, name: str) -> list[tuple[int, ...]] | None:
        """The shapes the model description allows for input `name` (None: one fixed shape, see the function)."""
        for feature in self.spec.description.input:
            if feature.name == name and feature.type.WhichOneof("Type") == "multiArrayType":
                array = feature.type.multiArrayType
                if array.WhichOneof("ShapeFlexibility") == "enumeratedShapes":
                    return [tuple(shape.shape) for shape in array.enumeratedShapes.shapes]
        return None

    def function_for(self, shapes: Mapping[str, tuple[int, ...]]):
        """The main function typed for these input shapes (the loaded one when its input shapes are static)."""
        from coremltools.converters.mil.mil.types.symbolic import any_symbolic

        if not any(any_symbolic(var.shape) for var in self.function.inputs.values()):
            return self.function
        key = tuple(sorted((name, tuple(shape)) for name, shape in shapes.items()))
        if key not in self._specialised:
            spec = type(self.spec)()
            spec.CopyFrom(self.spec)
            for named in spec.mlProgram.functions["main"].inputs:
                dims = named.type.tensorType.dimensions
                for dim, size in zip(dims, shapes[named.name]):
                    dim.constant.size = int(size)
            self._specialised[key] = self._load(spec).functions["main"]
        return self._specialised[key]

    def op_types(self) -> Counter:
        return Counter(op.op_type for op in self.function.operations)

    def unsupported_ops(self) -> list[str]:
        """Op types in the program that this evaluator cannot run (empty when it can run all of them)."""
        from coremltools.converters.mil.mil.operation import Operation

        missing = set()
        for op in self.function.operations:
            name = op.op_type
            if name == "const" or name.startswith(COMPRESSION_OP_PREFIX) or name in CUSTOM_OPS:
                continue
            if type(op).value_inference is Operation.value_inference:
                missing.add(name)
        return sorted(missing)

    def constants(self) -> dict[str, np.ndarray]:
        """Every constant the program holds by name, scalars and values written inline into op arguments included."""
        function_inputs = set(self.function.inputs)
        values: dict[str, np.ndarray] = {}
        for op in self.function.operations:
            candidates = list(op.outputs) if op.op_type == "const" else []
            for arg in op.inputs.values():
                candidates += list(arg) if isinstance(arg, (list, tuple)) else [arg]
            for var in candidates:
                if var.name in function_inputs or (var.op is not None and var.op.op_type != "const"):
                    continue
                value = var.val
                if isinstance(value, (np.ndarray, np.generic, int, float)) and not isinstance(value, bool):
                    values[var.name] = np.asarray(value)
        return values

    def weights(self) -> dict[str, np.ndarray]:
        """Every constant tensor of the program by name, compressed ones materialised (what the package stores)."""
        values: dict[str, np.ndarray] = {}
        for op in self.function.operations:
            if op.op_type == "const":
                value = op.outputs[0].val
                if isinstance(value, np.ndarray) and value.size > 1:
                    values[op.outputs[0].name] = value
            elif op.op_type.startswith(COMPRESSION_OP_PREFIX):
                for var in op.inputs.values():
                    if var.op is not None and var.name in values:
                        _bind(var, values[var.name])
                outputs = op.materialized_val_inference()
                outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                for var, value in zip(op.outputs, outputs):
                    values[var.name] = np.asarray(value).astype(_numpy_dtype(var))
        return values

    def run(self, inputs: Mapping[str, np.ndarray], observe: Observer | None = None) -> dict[str, np.ndarray]:
        """Evaluate the program on `inputs` (name -> array); returns output name -> array in the declared dtypes.

        `observe(op, outputs)`, when given, sees every non-const op's outputs as the op computed them (float32,
        before rounding to the declared dtype, so a value past fp16's range is still finite there), while the op's
        inputs are still bound (`op.x.val`): the readiness report reads per-op ranges and intermediates through it.
        """
        missing = self.unsupported_ops()
        if missing:
            raise UserError(f"{self.path}: the reference evaluator has no implementation of op(s) {', '.join(missing)}")
        for name, var in self.function.inputs.items():
            if name not in inputs:
                raise UserError(f"{self.path}: input {name!r} not given (the package takes {self.input_names})")
            _check_shape(self.path, name, np.shape(inputs[name]), var.shape, self.allowed_shapes(name))
        function = self.function_for({name: np.shape(inputs[name]) for name in self.input_names})
        values: dict[str, np.ndarray] = {}
        for name, var in function.inputs.items():
            values[name] = np.asarray(inputs[name]).astype(_numpy_dtype(var))
        touched = []
        try:
            for op in function.operations:
                if op.op_type == "const":
                    continue
                for arg in op.inputs.values():
                    for var in arg if isinstance(arg, (list, tuple)) else (arg,):
                        if var.name in values:
                            _bind(var, _widen(values[var.name]))
                            touched.append(var)
                outputs = self._evaluate(op)
                if observe is not None:
                    observe(op, outputs)
                for var, value in zip(op.outputs, outputs):
                    values[var.name] = np.asarray(value).astype(_numpy_dtype(var))
        finally:
            for var in touched:  # leave the program as loaded: no stale values for the next run
                var._sym_val = None
        return {var.name: values[var.name] for var in function.outputs}

    @staticmethod
    def _evaluate(op) -> tuple:
        if op.op_type.startswith(COMPRESSION_OP_PREFIX):
            result = op.materialized_val_inference()
        elif op.op_type in CUSTOM_OPS:
            result = CUSTOM_OPS[op.op_type](op)
        else:
            result = op.value_inference()
        return result if isinstance(result, tuple) else (result,)


def _check_shape(path: Path, name: str, shape: tuple, declared: tuple, allowed: list[tuple] | None) -> None:
    from coremltools.converters.mil.mil.types.symbolic import is_symbolic

    shape = tuple(int(s) for s in shape)
    if allowed is not None:
        fits = shape in allowed
    else:
        fits = len(shape) == len(declared) and all(is_symbolic(d) or int(d) == s for s, d in zip(shape, declared))
    if not fits:
        expected = allowed if allowed is not None else tuple(declared)
        raise UserError(f"{path}: input {name!r} has shape {shape}, the package accepts {expected}")


def load_program(path: str | Path) -> ReferenceProgram:
    """A saved .mlpackage's ML Program, loaded back with coremltools' milproto loader."""
    spec, weights_dir = package_spec(path)
    if spec.WhichOneof("Type") != "mlProgram":
        raise UserError(f"{path}: not an ML Program (the reference evaluator runs ML Programs only)")
    return ReferenceProgram(Path(path), spec, weights_dir)


__all__ = ["CUSTOM_OPS", "ReferenceProgram", "batch_norm", "conv", "instance_norm", "load_program", "package_spec", "silu"]
