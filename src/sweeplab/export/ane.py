"""The Neural-Engine layout: the trained model rewritten as apple/ml-ane-transformers recommends, same weights.

Tensors flow as (B, C, 1, S): channels on axis 1, the sequence on the last axis, so every Linear becomes a 1x1
Conv2d, LayerNorm normalises axis 1, and attention runs one head at a time with einsums whose layouts the Neural
Engine handles well. Each wrapper holds the trained module and reads its parameters at call time (reshaped to conv
kernels), so nothing is copied, retrained or re-initialised, and the export holds exactly the checkpoint's weights.
The inputs and the output keep the standard model's names, shapes and meaning: an app can swap the two packages.

The layout helpers every family's wrapper uses (`to_channels_first`, `conv1x1`, `ChannelLayerNorm`) are plain torch, in
sweeplab.models.ane_layout; here is `to_ane_layout`, which wraps a trained model in its family's layout (`ExportSpec.ane_layout`). The wrappers live
beside their families' export specs: `families/textbridge/ane.py`, `families/pagating_lm/ane.py`.
"""

from __future__ import annotations

from torch import nn

from sweeplab.families import Family, get_family, names, resolve


def to_ane_layout(model: nn.Module, family: Family | None = None) -> nn.Module:
    """The Neural-Engine wrapper of a trained model (eval mode, sharing its parameters): the one its family's export
    spec names (`ane_layout`); without `family`, the family whose `model` is the model's class."""
    family = family or _family_of(model)
    spec = family.export if family is not None else None
    if spec is None or spec.ane_layout is None:
        raise ValueError(f"no Neural-Engine layout for a {type(model).__name__}")
    return resolve(spec.ane_layout, f"family {family.name}", "export.ane_layout")(model).eval()


def _family_of(model: nn.Module) -> Family | None:
    for name in names():
        family = get_family(name)
        if family.model is not None and isinstance(model, family.target("model")):
            return family
    return None


__all__ = ["to_ane_layout"]
