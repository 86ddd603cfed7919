"""The Neural-Engine layout computes what the standard model computes, with the trained model's own parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sweeplab.export.ane import to_ane_layout
from sweeplab.families.pagating_lm.ane import ANEGPT
from sweeplab.families.textbridge.ane import ANETextBridge
from sweeplab.models.ane_layout import ChannelLayerNorm
from sweeplab.models.gpt import GPT, GPTConfig
from sweeplab.models.textbridge import TextBridgeConfig, TextBridgeEncoder

V = 97


def _inputs(batch=3, seq=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (batch, seq), generator=generator)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, 9:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    return ids, mask


def _assert_same(model: nn.Module, ane: nn.Module) -> None:
    ids, mask = _inputs()
    with torch.no_grad():
        expected, actual = model(ids, mask), ane(ids, mask)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"unit": "paGELU", "unit_options": {"approximate": "tanh", "gate_norm": True}},
        {"unit": "paGTU", "alpha": "learnable"},
        {"unit": "paSwishU", "alpha": 0.8, "unit_options": {"learnable_beta": True, "beta": 1.5}},
        {"unit": "paMishU", "alpha": "cosine", "unit_options": {"schedule_steps": 10}},
        {"unit": "paSiLU", "alpha": 1},
        {"unit": "paReGLU", "bias": False},
        {"ffn": "mlp"},
        {"param_matched": True, "d_ff": 192},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "paGLU",
)
def test_gpt_ane_layout_equals_the_model(overrides):
    torch.manual_seed(0)
    config = GPTConfig(**{**dict(vocab_size=V, block_size=32, n_layer=2, n_head=4, d_model=32, d_ff=64), **overrides})
    model = GPT(config).eval()
    for p in model.parameters():  # move off the init: a wrapper that re-initialised anything would now differ
        p.data.add_(0.05 * torch.randn_like(p))
    _assert_same(model, to_ane_layout(model))


@pytest.mark.parametrize("use_tanh", [False, True])
def test_textbridge_ane_layout_equals_the_model(use_tanh):
    torch.manual_seed(0)
    config = TextBridgeConfig(
        vocab_size=V, d_model=32, d_hidden=48, n_blocks=3, kernel_size=3, dilations=[1, 2, 4], out_dim=24,
        use_tanh=use_tanh,
    )
    model = TextBridgeEncoder(config).eval()
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    _assert_same(model, to_ane_layout(model))


def test_wrappers_hold_no_parameters_of_their_own():
    gpt = GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, d_model=16, d_ff=32))
    tb = TextBridgeEncoder(TextBridgeConfig(vocab_size=V, d_model=16, d_hidden=16, n_blocks=1, out_dim=8))
    for model, ane in ((gpt, ANEGPT(gpt)), (tb, ANETextBridge(tb))):
        model_params = {id(p) for p in model.parameters()}
        assert {id(p) for p in ane.parameters()} == model_params  # shared, not copied


def test_channel_layer_norm_normalises_axis_one():
    norm = nn.LayerNorm(8)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    x = torch.randn(2, 5, 8)  # (B, S, C)
    channels_first = x.transpose(1, 2).unsqueeze(2)  # (B, C, 1, S)
    out = ChannelLayerNorm(norm)(channels_first).squeeze(2).transpose(1, 2)
    torch.testing.assert_close(out, norm(x), rtol=1e-5, atol=1e-5)


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="no Neural-Engine layout for a Linear"):
        to_ane_layout(nn.Linear(2, 2))
