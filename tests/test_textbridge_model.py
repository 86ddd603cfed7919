import pytest
import torch

from sweeplab.families.textbridge.task import LossConfig, distill_loss, retrieval_metrics
from sweeplab.models.textbridge import SIZES, TextBridgeConfig, TextBridgeEncoder, receptive_field


def tiny(**overrides) -> TextBridgeEncoder:
    torch.manual_seed(0)
    return TextBridgeEncoder(TextBridgeConfig(vocab_size=50, out_dim=12, **{**SIZES["tiny"], **overrides}))


def test_tcn_is_causal_changing_a_later_token_never_changes_earlier_positions():
    model = tiny().eval()
    ids = torch.randint(1, 50, (2, 16))
    mask = torch.ones(2, 16)
    before = model.trunk(ids, mask)
    for t in (3, 9, 15):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] % 49) + 1
        after = model.trunk(changed, mask)
        torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=0)
        assert not torch.allclose(after[:, t], before[:, t])


def test_receptive_field_reaches_back_exactly_as_far_as_the_dilations_say():
    model = tiny(n_blocks=2, kernel_size=3, dilations=[1, 2]).eval()
    rf = receptive_field(model.config)
    assert rf == 1 + 2 * 1 + 2 * 2
    ids = torch.randint(1, 50, (1, 20))
    mask = torch.ones(1, 20)
    base = model.trunk(ids, mask)
    last = 19
    inside, outside = ids.clone(), ids.clone()
    inside[0, last - rf + 1] = (ids[0, last - rf + 1] % 49) + 1
    outside[0, last - rf] = (ids[0, last - rf] % 49) + 1
    assert not torch.allclose(model.trunk(inside, mask)[0, last], base[0, last])
    torch.testing.assert_close(model.trunk(outside, mask)[0, last], base[0, last], rtol=0, atol=0)


def test_padding_never_changes_the_embedding():
    model = tiny().eval()
    ids = torch.randint(1, 50, (1, 7))
    alone = model(ids, torch.ones(1, 7))
    for pad_len, pad_value in ((1, 0), (9, 0), (5, 17)):  # any pad id, any amount
        padded = torch.cat([ids, torch.full((1, pad_len), pad_value)], 1)
        mask = torch.cat([torch.ones(1, 7), torch.zeros(1, pad_len)], 1)
        torch.testing.assert_close(model(padded, mask), alone, rtol=1e-6, atol=1e-6)


def test_padded_positions_are_zero_after_every_block():
    model = tiny()
    ids = torch.randint(1, 50, (2, 10))
    mask = torch.ones(2, 10)
    mask[0, 6:] = 0
    for upto in range(1, model.config.n_blocks + 1):
        features = model.trunk(ids, mask, upto=upto)
        assert torch.count_nonzero(features[0, 6:]) == 0


def test_freeze_modes_choose_what_trains():
    model = tiny(n_blocks=3, dilations=[1, 2, 4], freeze="trunk_except_last")
    assert not model.embedding.weight.requires_grad
    assert [any(p.requires_grad for p in b.parameters()) for b in model.blocks] == [False, False, True]
    assert model.head.weight.requires_grad and model.first_trainable_block == 2
    model.apply_freeze("trunk")
    assert model.first_trainable_block == 3 and model.num_parameters(trainable_only=True) == 12 * 32 + 12
    model.apply_freeze("none")
    assert model.first_trainable_block == 0


def test_original_init_draws_from_the_stated_ranges():
    model = tiny(init="original", d_model=16, d_hidden=24, kernel_size=3)
    assert model.embedding.weight.abs().max() <= 0.02
    conv = model.blocks[0].conv
    assert conv.weight.abs().max() <= 1 / (16 * 3)
    assert model.head.weight.abs().max() <= 1 / 16
    assert conv.bias.abs().max() <= 0.001
    assert torch.equal(model.blocks[0].norm.weight, torch.ones(16))


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="model.freeze"):
        TextBridgeConfig(freeze="everything")
    with pytest.raises(ValueError, match="d_model"):
        TextBridgeConfig(d_model=0)


def test_loss_is_alpha_one_minus_cos_plus_beta_mse():
    torch.manual_seed(0)
    z, t = torch.randn(4, 8), torch.randn(4, 8)
    loss, cos, mse = distill_loss(z, t, LossConfig(alpha=0.3, beta=2.0))
    expected_cos = torch.nn.functional.cosine_similarity(z, t).mean()
    torch.testing.assert_close(cos, expected_cos)
    torch.testing.assert_close(mse, ((z - t) ** 2).mean())
    torch.testing.assert_close(loss, 0.3 * (1 - expected_cos) + 2.0 * mse)


def test_loss_edge_cases():
    t = torch.randn(3, 5)
    loss, cos, mse = distill_loss(t.clone(), t, LossConfig(alpha=1.0, beta=1.0))
    assert loss.abs() < 1e-6 and cos > 1 - 1e-6
    zero = torch.zeros(3, 5)  # a zero vector: clamped norms keep it finite
    loss, cos, _ = distill_loss(zero, t, LossConfig(alpha=1.0, beta=0.0))
    assert torch.isfinite(loss) and cos == 0
    loss, _, mse = distill_loss(-t, t, LossConfig(alpha=1.0, beta=0.0))
    torch.testing.assert_close(loss, torch.tensor(2.0))
    z = torch.randn(3, 5, dtype=torch.bfloat16)
    assert distill_loss(z, t, LossConfig()).__getitem__(0).dtype == torch.float32


@pytest.mark.parametrize("alpha,beta", [(-0.1, 1.0), (1.0, -1.0), (0.0, 0.0)])
def test_loss_rejects_bad_weights(alpha, beta):
    with pytest.raises(ValueError):
        LossConfig(alpha=alpha, beta=beta)


def test_retrieval_metrics():
    t = torch.eye(4)
    p1, mrr = retrieval_metrics(t.clone(), t)
    assert p1 == 1 and mrr == 1
    z = t[[1, 0, 2, 3]]  # first two swapped: each ranks its own target second
    p1, mrr = retrieval_metrics(z, t)
    assert p1 == 0.5 and mrr == pytest.approx((0.5 + 0.5 + 1 + 1) / 4)


def test_flops_per_sample_counts_backward_only_for_what_trains():
    full = tiny()
    frozen = tiny(freeze="trunk")
    c = full.config
    forward = full.flops_per_sample(10, training=False)
    assert forward == c.n_blocks * 2 * 10 * (c.d_model * c.d_hidden * c.kernel_size + c.d_hidden * c.d_model) + 2 * c.d_model * c.out_dim
    assert full.flops_per_sample(10) == 3 * forward
    assert frozen.flops_per_sample(10) == forward + 2 * 2 * c.d_model * c.out_dim


def test_block_on_real_tokens_of_a_fixed_input_matches_the_padded_block():
    """The frozen-trunk cache's CPU path: same outputs and same gradients (γ, β, conv, projection) as forward()."""
    from sweeplab.models.textbridge import TCNBlock

    torch.manual_seed(0)
    block = TCNBlock(d_model=16, d_hidden=24, kernel_size=3, dilation=2)
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.uniform_(-0.5, 0.5)
    lengths = torch.tensor([5, 1, 9, 3])
    mask = (torch.arange(9)[None] < lengths[:, None]).float()
    x = torch.randn(4, 9, 16) * mask.unsqueeze(-1)  # what a cached trunk holds: zero past each sample's end

    dense = block(x, mask)
    grads_dense = torch.autograd.grad((dense**2).sum(), list(block.parameters()))
    tokens = x[mask.bool()]
    position = torch.cat([torch.arange(int(n)) for n in lengths])
    packed = block.forward_fixed_input_tokens(tokens, position)
    grads_packed = torch.autograd.grad((packed**2).sum(), list(block.parameters()))

    torch.testing.assert_close(packed, dense[mask.bool()], rtol=1e-5, atol=1e-6)
    for g_dense, g_packed in zip(grads_dense, grads_packed):
        torch.testing.assert_close(g_packed, g_dense, rtol=1e-4, atol=1e-5)
