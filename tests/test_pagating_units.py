import math

import pytest
import torch
import torch.nn.functional as F

from sweeplab.models.pagating import (
    UNIT_NAMES,
    AlphaGate,
    alpha_values,
    iter_units,
    make_unit,
    set_alpha_step,
)

D_IN, D_OUT = 6, 5
NAMED_UNITS = [n for n in UNIT_NAMES if n != "paUnit"]


def gate_fn(name: str):
    """g of each unit, written out from docs/models.md rather than taken from the module."""
    return {
        "paGLU": torch.sigmoid,
        "paGTU": torch.sigmoid,
        "paReGLU": torch.relu,
        "paSiLU": lambda z: z * torch.sigmoid(z),
        "paSwishU": lambda z: z * torch.sigmoid(1.0 * z),
        "paGELU": lambda z: 0.5 * z * (1 + torch.erf(z / math.sqrt(2))),
        "paMishU": lambda z: z * torch.tanh(F.softplus(z)),
    }[name]


def by_hand(unit, x, g, alpha, value_tanh=False):
    a = x @ unit.value_proj.weight.T + unit.value_proj.bias
    b = x @ unit.gate_proj.weight.T + unit.gate_proj.bias
    if value_tanh:
        a = torch.tanh(a)
    return a * (alpha * g(b) + (1 - alpha))


@pytest.mark.parametrize("name", NAMED_UNITS)
@pytest.mark.parametrize("alpha", [0, 0.3, 1])
def test_unit_matches_formula(name, alpha):
    torch.manual_seed(0)
    unit = make_unit(name, D_IN, D_OUT, alpha)
    x = torch.randn(3, 4, D_IN)
    expected = by_hand(unit, x, gate_fn(name), alpha, value_tanh=name == "paGTU")
    torch.testing.assert_close(unit(x), expected)


@pytest.mark.parametrize("name", NAMED_UNITS)
def test_alpha_zero_is_the_value_path(name):
    unit = make_unit(name, D_IN, D_OUT, 0)
    x = torch.randn(7, D_IN)
    value = unit.value_proj(x)
    torch.testing.assert_close(unit(x), torch.tanh(value) if name == "paGTU" else value)


def test_pa_unit_takes_any_activation():
    x = torch.randn(4, D_IN)
    for activation in (torch.nn.Tanh(), torch.tanh, "tanh"):
        unit = make_unit("paUnit", D_IN, D_OUT, 0.3, activation=activation)
        torch.testing.assert_close(unit(x), by_hand(unit, x, torch.tanh, 0.3))
    with pytest.raises(ValueError, match="paUnit"):
        make_unit("paUnit", D_IN, D_OUT)
    with pytest.raises(ValueError, match="only for paUnit"):
        make_unit("paGLU", D_IN, D_OUT, activation=torch.tanh)


def test_unknown_unit_lists_valid_names():
    with pytest.raises(ValueError, match="paGLU.*paUnit"):
        make_unit("paFoo", D_IN, D_OUT)


@pytest.mark.parametrize("bad", [True, False, -0.1, 1.5, float("nan"), "static", None, 2])
def test_bad_alpha_rejected_naming_the_value(bad):
    with pytest.raises(ValueError, match=f"alpha={bad!r}".replace("(", r"\(").replace(")", r"\)")):
        make_unit("paGLU", D_IN, D_OUT, bad)


def test_learnable_alpha_starts_at_alpha_init_and_gets_gradients():
    unit = make_unit("paGLU", D_IN, D_OUT, "learnable")
    assert unit.alpha.item() == pytest.approx(0.5, abs=1e-7)
    assert unit.alpha_gate.theta.item() == 0.0
    unit = make_unit("paGLU", D_IN, D_OUT, "learnable", alpha_init=0.8)
    assert unit.alpha.item() == pytest.approx(0.8, abs=1e-6)
    unit(torch.randn(4, D_IN)).square().sum().backward()
    assert unit.alpha_gate.theta.grad is not None and unit.alpha_gate.theta.grad.abs() > 0
    with pytest.raises(ValueError, match="alpha_init"):
        make_unit("paGLU", D_IN, D_OUT, "learnable", alpha_init=1.0)


def test_swish_beta_fixed_or_learnable():
    x = torch.randn(4, D_IN)
    unit = make_unit("paSwishU", D_IN, D_OUT, 0.7, beta=2.0)
    torch.testing.assert_close(unit(x), by_hand(unit, x, lambda z: z * torch.sigmoid(2.0 * z), 0.7))
    assert not any(p.ndim == 0 for p in unit.parameters())
    unit = make_unit("paSwishU", D_IN, D_OUT, 0.7, beta=1.5, learnable_beta=True)
    unit(x).square().sum().backward()
    assert unit.activation.beta.grad is not None and unit.activation.beta.grad.abs() > 0


def test_gelu_tanh_flag_changes_output():
    torch.manual_seed(0)
    exact = make_unit("paGELU", D_IN, D_OUT, 1)
    approx = make_unit("paGELU", D_IN, D_OUT, 1, approximate="tanh")
    approx.load_state_dict(exact.state_dict())
    x = 3 * torch.randn(16, D_IN)
    assert not torch.equal(exact(x), approx(x))
    tanh_gelu = lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))  # noqa: E731
    torch.testing.assert_close(approx(x), by_hand(approx, x, tanh_gelu, 1))
    with pytest.raises(ValueError, match="approximate"):
        make_unit("paGELU", D_IN, D_OUT, approximate="fast")


def test_gate_norm_is_applied_before_the_alpha_mix():
    unit = make_unit("paGLU", D_IN, D_OUT, 0.3, gate_norm=True)
    with torch.no_grad():
        unit.gate_norm.weight.uniform_(0.5, 1.5)
        unit.gate_norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, D_IN)
    norm = lambda z: F.layer_norm(torch.sigmoid(z), (D_OUT,), unit.gate_norm.weight, unit.gate_norm.bias)  # noqa: E731
    torch.testing.assert_close(unit(x), by_hand(unit, x, norm, 0.3))
    assert not torch.allclose(unit(x), by_hand(unit, x, torch.sigmoid, 0.3))


def test_cosine_schedule_moves_with_steps_and_reverse():
    unit = make_unit("paGLU", D_IN, D_OUT, "cosine", schedule_steps=10)
    assert unit.scheduled and unit.alpha.item() == 1.0
    seen = []
    for step in (0, 5, 10, 20):
        unit.set_step(step)
        seen.append(unit.alpha.item())
    assert seen == pytest.approx([1.0, 0.5, 0.0, 0.0], abs=1e-6)
    reverse = AlphaGate("cosine", schedule_steps=10, schedule_reverse=True)
    reverse.set_step(0)
    assert reverse.alpha.item() == pytest.approx(0.0, abs=1e-6)
    reverse.set_step(10)
    assert reverse.alpha.item() == pytest.approx(1.0)


def test_linear_ramp_min_to_max():
    gate = AlphaGate("linear", schedule_steps=4, alpha_min=0.2, alpha_max=0.6)
    values = []
    for step in range(6):
        gate.set_step(step)
        values.append(gate.alpha.item())
    assert values == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6, 0.6])
    with pytest.raises(ValueError, match="alpha_min"):
        AlphaGate("linear", alpha_min=0.9, alpha_max=0.1)
    with pytest.raises(ValueError, match="schedule_steps"):
        AlphaGate("cosine", schedule_steps=0)


def test_scheduled_alpha_is_state_that_follows_the_module():
    unit = make_unit("paGLU", D_IN, D_OUT, "cosine", schedule_steps=10)
    unit.set_step(5)
    assert "alpha_gate.value" in unit.state_dict()
    fresh = make_unit("paGLU", D_IN, D_OUT, "cosine", schedule_steps=10)
    fresh.load_state_dict(unit.state_dict())
    assert fresh.alpha.item() == pytest.approx(0.5)
    # the buffer moves with .to(): the dtype follows, and on the meta device nothing is left on the CPU
    unit.to(torch.float64)
    assert unit.alpha.dtype == torch.float64
    unit.set_step(10)
    assert unit.alpha.dtype == torch.float64 and unit.alpha.item() == 0.0
    meta = make_unit("paGLU", D_IN, D_OUT, "cosine", schedule_steps=10).to("meta")
    meta.set_step(3)  # stepping works in place, without creating host tensors
    assert meta.alpha.device.type == "meta"
    assert meta(torch.randn(2, D_IN, device="meta")).device.type == "meta"
    for alpha in (0.5, "learnable"):
        assert make_unit("paGLU", D_IN, D_OUT, alpha).to("meta").alpha.device.type == "meta"


def test_half_precision_keeps_the_input_dtype():
    unit = make_unit("paSiLU", D_IN, D_OUT, "learnable")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert unit(torch.randn(2, D_IN)).dtype == torch.bfloat16


def test_iter_units_step_and_values():
    model = torch.nn.Sequential(
        make_unit("paGLU", D_IN, D_OUT, "cosine", schedule_steps=4),
        torch.nn.ReLU(),
        make_unit("paSiLU", D_OUT, D_OUT, 0.25),
        make_unit("paGLU", D_OUT, D_OUT, "learnable", alpha_init=0.75),
    )
    assert [name for name, _ in iter_units(model)] == ["0", "2", "3"]
    set_alpha_step(model, 2)
    assert alpha_values(model) == pytest.approx({"0": 0.5, "2": 0.25, "3": 0.75})
