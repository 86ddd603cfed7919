"""The Linux reference evaluator: its own op implementations against PyTorch, and a saved package run end to end.

The evaluator leans on coremltools 9.0 private API (milproto loader, Var._sym_val, per-op value_inference); these
tests pin it: they fail loudly if a coremltools upgrade changes any of it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sweeplab.core.errors import UserError
from sweeplab.export import reference
from sweeplab.export.reference import load_program


def _op(**inputs):
    """A stand-in for a MIL op: each input has a `.val`, as the evaluator binds them; None for an absent one."""
    return SimpleNamespace(**{k: (None if v is None else SimpleNamespace(val=v)) for k, v in inputs.items()})


RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "spatial, kernel, stride, dilation, groups, pad",
    [
        ((11,), (3,), (1,), (2,), 1, [(4, 0)]),  # TextBridge's causal dilated conv: left padding only
        ((9,), (1,), (1,), (1,), 1, [(0, 0)]),  # 1x1
        ((1, 13), (1, 3), (1, 1), (1, 4), 1, [(0, 0), (8, 0)]),  # the ANE layout's (1, k) conv
        ((6, 7), (3, 2), (2, 1), (1, 2), 2, [(1, 1), (0, 2)]),  # strides, groups, both-sided padding
    ],
)
def test_conv_matches_torch(spatial, kernel, stride, dilation, groups, pad):
    c_in, c_out = 4, 6
    x = RNG.standard_normal((2, c_in, *spatial)).astype(np.float32)
    w = RNG.standard_normal((c_out, c_in // groups, *kernel)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    flat_pad = [p for pair in pad for p in pair]
    op = _op(x=x, weight=w, bias=b, strides=list(stride), dilations=list(dilation), groups=groups,
             pad_type="custom", pad=flat_pad)
    torch_pad = [p for pair in reversed(pad) for p in pair]  # F.pad: last axis first
    conv = F.conv1d if len(spatial) == 1 else F.conv2d
    expected = conv(F.pad(torch.from_numpy(x), torch_pad), torch.from_numpy(w), torch.from_numpy(b),
                    stride=stride, dilation=dilation, groups=groups).numpy()
    np.testing.assert_allclose(reference.conv(op), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pad_type", ["valid", "same"])
def test_conv_pad_types(pad_type):
    x = RNG.standard_normal((1, 3, 10)).astype(np.float32)
    w = RNG.standard_normal((5, 3, 3)).astype(np.float32)
    op = _op(x=x, weight=w, bias=None, strides=[1], dilations=[1], groups=1, pad_type=pad_type, pad=None)
    expected = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), padding=pad_type).numpy()
    np.testing.assert_allclose(reference.conv(op), expected, rtol=1e-5, atol=1e-5)


def test_silu_batch_norm_instance_norm_match_torch():
    x = RNG.standard_normal((2, 4, 1, 5)).astype(np.float32)
    np.testing.assert_allclose(reference.silu(_op(x=x)), F.silu(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-6)
    mean, var, gamma, beta = (RNG.standard_normal(4).astype(np.float32) for _ in range(4))
    var = np.abs(var) + 0.1
    expected = F.batch_norm(torch.from_numpy(x), *(torch.from_numpy(a) for a in (mean, var, gamma, beta)), eps=1e-5)
    got = reference.batch_norm(_op(x=x, mean=mean, variance=var, gamma=gamma, beta=beta, epsilon=1e-5))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)
    expected = F.instance_norm(torch.from_numpy(x), weight=torch.from_numpy(gamma), bias=torch.from_numpy(beta), eps=1e-5)
    got = reference.instance_norm(_op(x=x, gamma=gamma, beta=beta, epsilon=1e-5))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4)


# --- a saved package, run end to end --------------------------------------------------------------
class OpZoo(torch.nn.Module):
    """One of each op family the two models produce, in one small graph."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 8)
        self.conv = torch.nn.Conv1d(8, 8, 3, dilation=2)
        self.norm = torch.nn.LayerNorm(8)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        x = self.norm(self.embedding(input_ids))  # gather, layer_norm
        h = self.conv(F.pad(x.transpose(1, 2), (4, 0))).transpose(1, 2)  # pad, conv, transpose
        h = F.silu(h) + F.gelu(h, approximate="tanh") + torch.sigmoid(h) * torch.tanh(h)  # silu, gelu, ...
        mask = attention_mask.to(h.dtype)[:, :, None]
        scores = (h @ h.transpose(1, 2)).softmax(-1)  # matmul, softmax
        y = self.linear(scores @ h) * mask  # linear
        return y.sum(1) / mask.sum(1).clamp_min(1e-9)  # reduce_sum, maximum, real_div


@pytest.fixture(scope="module")
def zoo_package(tmp_path_factory):
    from sweeplab.export.convert import convert
    from sweeplab.export.options import ExportOptions

    torch.manual_seed(0)
    model = OpZoo().eval()
    converted = convert(model, "out", ExportOptions(precision="fp32"), seq_len=12, vocab_size=50)
    path = tmp_path_factory.mktemp("zoo") / "zoo.mlpackage"
    converted.mlmodel.save(str(path))
    return model, path


def test_saved_package_runs_and_matches_torch(zoo_package):
    model, path = zoo_package
    program = load_program(path)
    assert program.input_names == ["input_ids", "attention_mask"] and program.output_names == ["out"]
    assert program.unsupported_ops() == []
    assert {"conv", "silu", "gelu", "layer_norm", "gather", "softmax", "linear", "reduce_sum"} <= set(program.op_types())
    ids = np.random.default_rng(1).integers(0, 50, (1, 12)).astype(np.int32)
    mask = np.ones((1, 12), dtype=np.int32)
    mask[0, 8:] = 0
    out = program.run({"input_ids": ids, "attention_mask": mask})["out"]
    with torch.no_grad():
        expected = model(torch.from_numpy(ids).long(), torch.from_numpy(mask).long()).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    # runs leave no values behind: a second run on other inputs gives that input's answer
    again = program.run({"input_ids": ids[:, ::-1].copy(), "attention_mask": np.ones_like(mask)})["out"]
    assert not np.allclose(again, out)


def test_wrong_input_shape_and_missing_input_are_clear(zoo_package):
    _, path = zoo_package
    program = load_program(path)
    with pytest.raises(UserError, match=r"input 'input_ids' has shape \(1, 7\), the package accepts \(1, 12\)"):
        program.run({"input_ids": np.zeros((1, 7), np.int32), "attention_mask": np.ones((1, 7), np.int32)})
    with pytest.raises(UserError, match="input 'attention_mask' not given"):
        program.run({"input_ids": np.zeros((1, 12), np.int32)})


def test_op_without_an_implementation_is_named(zoo_package, monkeypatch):
    _, path = zoo_package
    monkeypatch.delitem(reference.CUSTOM_OPS, "conv")
    program = load_program(path)
    with pytest.raises(UserError, match="no implementation of op\\(s\\) conv"):
        program.run({"input_ids": np.zeros((1, 12), np.int32), "attention_mask": np.ones((1, 12), np.int32)})


def test_not_a_package_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a Core ML package"):
        load_program(tmp_path)
