"""PyTorch state dicts <-> MLX model parameters, exact (bit for bit) in both directions.

The MLX ports keep the PyTorch state dict's keys (`blocks.0.conv.weight`), so conversion is per array, with two
rules that hold for every family:
- convolution weights (3-d and more) are channels-last in MLX: PyTorch (C_out, C_in, *K) <-> MLX (C_out, *K, C_in);
- a model may name tied weights (`tied_weights`: PyTorch key -> the key it shares its tensor with); MLX holds one
  array, the PyTorch state dict both keys.
Buffers (a fixed α) are frozen arrays in MLX and travel like parameters. bfloat16 is carried through its bits
(numpy has no bfloat16). Nothing here knows a family.
"""

from __future__ import annotations

from collections.abc import Mapping

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import torch
from mlx.utils import tree_flatten, tree_unflatten


def tied_weights(model: nn.Module) -> dict[str, str]:
    return dict(getattr(model, "tied_weights", None) or {})


def to_mx(tensor: torch.Tensor, channels_last: bool = False) -> mx.array:
    t = tensor.detach().cpu()
    if channels_last:
        t = t.movedim(1, -1)
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return mx.array(t.view(torch.int16).numpy()).view(mx.bfloat16)
    return mx.array(t.numpy())


def to_torch(array: mx.array, channels_last: bool = False) -> torch.Tensor:
    if array.dtype == mx.bfloat16:
        t = torch.from_numpy(np.array(array.view(mx.int16))).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(array))  # np.array keeps a 0-d array 0-d (np.ascontiguousarray would not)
    return t.movedim(-1, 1).contiguous() if channels_last else t


def _is_conv(key: str, ndim: int) -> bool:
    return ndim >= 3 and key.endswith("weight")


def state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's arrays (trainable and frozen) as the PyTorch model's state dict, tied keys included."""
    out = {key: to_torch(a, _is_conv(key, a.ndim)) for key, a in tree_flatten(model.parameters())}
    for alias, source in tied_weights(model).items():
        out[alias] = out[source]
    return out


def mlx_arrays(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, mx.array]:
    """A PyTorch state dict as the model's flat {key: array}; keys and shapes checked against the model."""
    own = dict(tree_flatten(model.parameters()))
    tied = tied_weights(model)
    given = {k: v for k, v in state.items() if k not in tied}
    missing, unexpected = sorted(own.keys() - given.keys()), sorted(given.keys() - own.keys())
    if missing or unexpected:
        raise ValueError(f"state dict does not fit the MLX model: missing {missing}, unexpected {unexpected}")
    arrays = {key: to_mx(t, _is_conv(key, t.ndim)) for key, t in given.items()}
    wrong = [f"{k} {tuple(a.shape)} != {tuple(own[k].shape)}" for k, a in arrays.items() if a.shape != own[k].shape]
    if wrong:
        raise ValueError(f"state dict does not fit the MLX model: shapes {', '.join(wrong)}")
    return arrays


def load_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy a PyTorch state dict into the MLX model (strict: every key, every shape); frozen arrays stay frozen."""
    model.update(tree_unflatten(list(mlx_arrays(model, state).items())))
    mx.eval(model.parameters())


def arrays_to_torch(tree) -> dict:
    """An MLX tree of arrays (an optimizer's state, the random key) as {"arrays": {flat key: tensor}, "dtypes":
    {flat key: MLX dtype}}, for a checkpoint: floating arrays as tensors of their dtype (bit for bit), the others
    (the step count, uint64; the random key, uint32) as int64 tensors of the same values."""
    arrays, dtypes = {}, {}
    for key, array in tree_flatten(tree) if not isinstance(tree, mx.array) else [("", tree)]:
        floating = mx.issubdtype(array.dtype, mx.floating)
        arrays[key] = to_torch(array) if floating else torch.from_numpy(np.array(array.astype(mx.int64)))
        dtypes[key] = str(array.dtype).rsplit(".", 1)[-1]
    return {"arrays": arrays, "dtypes": dtypes}


def arrays_from_torch(saved: Mapping) -> mx.array | dict | list:
    """arrays_to_torch's inverse: the same tree (or the one array), the same dtypes and bits."""
    items = [(key, to_mx(t).astype(getattr(mx, saved["dtypes"][key]))) for key, t in saved["arrays"].items()]
    return items[0][1] if [key for key, _ in items] == [""] else tree_unflatten(items)


__all__ = [
    "arrays_from_torch", "arrays_to_torch", "load_state_dict", "mlx_arrays", "state_dict", "tied_weights", "to_mx",
    "to_torch",
]
