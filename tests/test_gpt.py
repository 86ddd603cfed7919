import math

import pytest
import torch
import torch.nn.functional as F

from sweeplab.models.gpt import GPT, SIZES, GPTConfig, padding_mask

V = 97


def tiny(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(vocab_size=V, block_size=32, n_layer=2, n_head=2, d_model=32, d_ff=128), **overrides})


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("ffn", ["pagating", "mlp"])
def test_attention_is_causal(with_mask, ffn):
    torch.manual_seed(0)
    model = GPT(tiny(ffn=ffn)).eval()
    ids = torch.randint(0, V, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :4] = 0  # left padding in the second row
    base = model(ids, mask if with_mask else None)
    for t in (1, 7, 15):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % V
        logits = model(changed, mask if with_mask else None)
        torch.testing.assert_close(logits[:, :t], base[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(logits[:, t], base[:, t])


def test_all_ones_mask_equals_no_mask_and_padding_is_hidden():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    ids = torch.randint(0, V, (2, 12))
    torch.testing.assert_close(model(ids, torch.ones_like(ids)), model(ids), atol=1e-5, rtol=1e-5)
    mask = torch.ones_like(ids)
    mask[:, :3] = 0
    changed = ids.clone()
    changed[:, 1] = (changed[:, 1] + 5) % V  # a masked key: real positions never see it
    torch.testing.assert_close(model(changed, mask)[:, 3:], model(ids, mask)[:, 3:], atol=1e-5, rtol=1e-5)


def test_padding_mask_is_finite_for_fp16():
    mask = padding_mask(torch.tensor([[0, 0, 1, 1]]), torch.float16)
    assert mask.shape == (1, 1, 4, 4) and torch.isfinite(mask).all() and mask.min().item() == -1e4
    keep = (mask[0, 0] == 0).int()
    assert keep.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]  # padded queries see themselves


def test_tied_embeddings_share_storage():
    model = GPT(tiny())
    assert model.lm_head.weight is model.wte.weight
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()


def test_gpt2_init():
    model = GPT(tiny(n_layer=8, d_model=64, d_ff=256, vocab_size=4096))
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    expected = 0.02 / math.sqrt(2 * 8)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(expected, rel=0.1)
    assert model.blocks[0].attn.proj.weight.std().item() == pytest.approx(expected, rel=0.1)
    assert model.blocks[0].mlp.unit.gate_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_parameter_count_and_flops_formula():
    c = tiny()
    model = GPT(c)
    d, f, L, T = c.d_model, c.d_ff, c.n_layer, c.block_size
    attn = d * 3 * d + 3 * d + d * d + d
    ffn = 2 * (d * f + f) + f * d + d
    norms = 2 * 2 * d
    expected = V * d + T * d + L * (attn + ffn + norms) + 2 * d
    assert model.num_parameters() == expected
    assert model.num_parameters(exclude_embeddings=True) == expected - V * d - T * d
    assert model.flops_per_token() == 6 * expected + 12 * L * d * T
    assert model.flops_per_token(seq_len=8) == 6 * expected + 12 * L * d * 8
    assert model.n_layer == 2


def test_param_matched_width_matches_the_mlp_baseline():
    small = {**SIZES["small"], "vocab_size": 50257}
    assert GPTConfig(**small, param_matched=True).ffn_hidden == 2048
    c = dict(vocab_size=V, block_size=32, n_layer=2, n_head=4, d_model=192, d_ff=768)
    baseline = GPT(GPTConfig(**c, ffn="mlp")).num_parameters()
    matched = GPT(GPTConfig(**c, param_matched=True)).num_parameters()
    unmatched = GPT(GPTConfig(**c)).num_parameters()
    assert abs(matched - baseline) / baseline < 0.01
    assert unmatched > 1.2 * baseline


def test_alpha_values_per_layer():
    assert GPT(tiny(ffn="mlp")).alpha_values() == {}
    model = GPT(tiny(alpha="linear", unit_options={"schedule_steps": 4}))
    assert model.alpha_values() == {"layer_0": 0.0, "layer_1": 0.0}
    for block in model.blocks:
        block.mlp.unit.set_step(2)
    assert model.alpha_values() == pytest.approx({"layer_0": 0.5, "layer_1": 0.5})


def test_config_errors():
    with pytest.raises(ValueError, match="ffn"):
        tiny(ffn="moe")
    with pytest.raises(ValueError, match="n_head"):
        tiny(n_head=3)
    with pytest.raises(ValueError, match="alpha"):
        tiny(alpha=1.5)
    with pytest.raises(ValueError, match="block_size"):
        GPT(tiny())(torch.zeros(1, 33, dtype=torch.long))


def test_gradient_checkpointing_same_loss_and_grads():
    torch.manual_seed(0)
    plain = GPT(tiny(alpha="learnable"))
    ckpt = GPT(tiny(alpha="learnable", gradient_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    ids = torch.randint(0, V, (2, 16))
    losses = []
    for model in (plain, ckpt):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.parametrize("ffn", ["pagating", "mlp"])
def test_tiny_lm_overfits_one_batch(ffn):
    torch.manual_seed(0)
    model = GPT(tiny(ffn=ffn))
    ids = torch.randint(0, V, (4, 33))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(300):
        loss = F.cross_entropy(model(inputs).reshape(-1, V), labels.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if loss.item() < 0.5:
            break
    assert loss.item() < 0.5
