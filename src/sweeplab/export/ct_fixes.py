"""Converter fixes for coremltools 9.0's PyTorch frontend, installed through its public extension point
(`register_torch_op(override=True)`). Each one does what the original does, plus the case it gets wrong:

- `gelu`: torch.export records `F.gelu(x, approximate="tanh")` with `approximate` as a keyword, and 9.0 reads it
  only as a positional argument, so the tanh-approximate GELU of TextBridge (and paGELU's option) silently became
  an exact GELU: ~1e-3 off, found by the reference evaluator's fp32 check.
- `|` and `&` of bool tensors (the LM's padding mask): torch.export records them as `__or__`/`__and__`, which 9.0
  does not convert ("Unsupported fx node or_1, kind __or__"); TorchScript's `or` has no converter either, and
  traced `torch.eye(n, dtype=bool)` arrives as float, so both operands are cast to bool as coremltools' own
  logical_or converter does.
- `eye`: 9.0 folds `torch.eye(n)` into a constant and fails when n is the (enumerated) sequence length
  ("'NoneType' object cannot be interpreted as an integer"); a dynamic n is built from range_1d and equal.
- `int`: the torch.jit.trace path converts `int(tensor.shape[i])` with `int(np.array([n]))`, which numpy >= 2.4
  refuses ("only 0-dimensional arrays can be converted to Python scalars").

tests/test_export_convert.py pins each fix with a tiny module (run through both tracers where they differ).
Revisit them when the coremltools pin moves: each replaces a whole converter of that version.
"""

from __future__ import annotations

import numpy as np

_installed = False


def install() -> None:
    """Register the fixed converters once per process (idempotent)."""
    global _installed
    if _installed:
        return
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.torch.ops import _get_inputs
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY, register_torch_op
    from coremltools.converters.mil.frontend.torch.utils import TorchFrontend
    from coremltools.converters.mil.mil import types

    def _value(arg):
        return getattr(arg, "val", arg)

    @register_torch_op(override=True)
    def gelu(context, node):
        inputs = _get_inputs(context, node, expected=[1, 2])
        approximate = _value(inputs[1]) if len(inputs) == 2 else None
        keyword = (node.kwinputs or {}).get("approximate")  # raw: a string literal, not a var in the context
        if keyword is not None:
            approximate = keyword[0] if isinstance(keyword, (list, tuple)) else keyword
        if approximate not in (None, "none", "tanh"):
            raise ValueError(f"gelu: unknown approximate={approximate!r}")
        mode = "TANH_APPROXIMATION" if approximate == "tanh" else None
        context.add(mb.gelu(x=inputs[0], mode=mode, name=node.name))

    def _logical(mil_op):
        def convert(context, node):
            x, y = _get_inputs(context, node, expected=2)
            if not (types.is_bool(x.dtype) or types.is_bool(y.dtype)):
                raise NotImplementedError(f"{node.kind} of {x.dtype} and {y.dtype}: only bool tensors are supported")
            context.add(mil_op(x=mb.cast(x=x, dtype="bool"), y=mb.cast(x=y, dtype="bool"), name=node.name))

        return convert

    # torch.export looks converters up as "__or__"/"__and__", TorchScript as "or"/"and"; register_torch_op refuses
    # names that end in "_", so the dunder keys go through the registry's own setter.
    logical_or, logical_and = _logical(mb.logical_or), _logical(mb.logical_and)
    register_torch_op(logical_or, torch_alias=["or"], override=True)
    _TORCH_OPS_REGISTRY.set_func_by_name(logical_or, "__or__")
    _TORCH_OPS_REGISTRY.set_func_by_name(logical_and, "__and__")

    @register_torch_op(torch_alias=["eye.m"], override=True)
    def eye(context, node):
        inputs = _get_inputs(context, node, min_expected=1)
        n = inputs[0]
        if context.frontend == TorchFrontend.TORCHSCRIPT:
            m = inputs[1] if len(inputs) == 6 else n  # eye(n, [m,] dtype, layout, device, pin_memory)
        else:
            m = inputs[1] if node.kind == "eye.m" else n
        if n.val is not None and m.val is not None:
            context.add(mb.const(val=np.eye(int(n.val), int(m.val)).astype(np.float32), name=node.name))
            return
        rows = mb.expand_dims(x=mb.range_1d(start=0, end=n, step=1), axes=[1])
        cols = mb.expand_dims(x=mb.range_1d(start=0, end=m, step=1), axes=[0])
        context.add(mb.cast(x=mb.equal(x=rows, y=cols), dtype="fp32", name=node.name))

    @register_torch_op(torch_alias=["int"], override=True)
    def _int(context, node):
        (x,) = _get_inputs(context, node, expected=1)
        if x.shape and not all(d == 1 for d in x.shape):
            raise ValueError("input to int must be either a scalar or a length 1 tensor")
        if x.can_be_folded_to_const():
            context.add(mb.const(val=int(np.asarray(x.val).reshape(())), name=node.name), node.name)
        elif x.shape:
            context.add(mb.cast(x=mb.squeeze(x=x, name=node.name + "_item"), dtype="int32", name=node.name), node.name)
        else:
            context.add(mb.cast(x=x, dtype="int32", name=node.name), node.name)

    _installed = True


__all__ = ["install"]
