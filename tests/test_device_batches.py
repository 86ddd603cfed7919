"""data.on_device changes where batches come from, not what they are: same tensors, same order, same resume, same losses."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import smoke_config
from sweeplab.core.channels import FAULT_RAISE_ENV
from sweeplab.core.errors import ConfigError
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.families.textbridge.data import TextBridgeDataModule
from sweeplab.families.textbridge.device_batches import DeviceBatches
from sweeplab.families.textbridge.task import TextBridgeTask

KEYS = ("input_ids", "attention_mask", "target", "sample_id")
BATCH, MAX_LEN = 8, 48  # 270 training samples: 33 batches an epoch; max_len cuts the longest demo sentences
_TRAINING_STEP = TextBridgeTask.training_step


def _datamodule(demo_dir, **kwargs) -> TextBridgeDataModule:
    dm = TextBridgeDataModule(path=str(demo_dir), batch_size=BATCH, max_len=MAX_LEN, **kwargs)
    with pytest.warns(UserWarning, match="longer than data.max_len"):
        dm.setup()
    return dm


def _assert_same_batch(got: dict, want: dict) -> None:
    assert set(got) == set(want) == set(KEYS)
    for key in KEYS:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


def _take(batches, n: int) -> list[dict]:
    """n batches, starting the next epoch whenever one ends (as a training loop does)."""
    out, iterator = [], iter(batches)
    while len(out) < n:
        try:
            out.append(next(iterator))
        except StopIteration:
            iterator = iter(batches)
    return out


@pytest.mark.parametrize("drop_last", [True, False])
def test_on_device_batches_are_the_dataloaders_for_two_epochs(demo_dir, drop_last):
    loader = _datamodule(demo_dir, drop_last=drop_last).train_dataloader()
    on_device = _datamodule(demo_dir, drop_last=drop_last, on_device=True).train_dataloader()
    assert isinstance(on_device, DeviceBatches) and len(on_device) == len(loader)
    for _ in range(2):
        got, want = list(on_device), list(loader)
        assert len(got) == len(want) == len(loader)
        widths = set()
        for g, w in zip(got, want):
            _assert_same_batch(g, w)
            widths.add(g["input_ids"].shape[1])
        assert len(widths) > 1  # pad_to=batch: the width follows each batch's longest sample
    if not drop_last:
        assert len(got[-1]["sample_id"]) < BATCH  # the partial last batch is kept


def test_pad_to_max_gives_one_shape_and_the_same_real_tokens(demo_dir):
    reference = _datamodule(demo_dir).train_dataloader()
    dm = _datamodule(demo_dir, pad_to="max")
    width = dm.fixed_len
    assert width == min(MAX_LEN, int(dm.source.token_lengths.max()))
    loader = dm.train_dataloader()
    on_device = _datamodule(demo_dir, pad_to="max", on_device=True).train_dataloader()
    for g, w, ref in zip(on_device, loader, reference, strict=True):
        _assert_same_batch(g, w)
        assert g["input_ids"].shape == g["attention_mask"].shape == (BATCH, width)
        cut = ref["input_ids"].shape[1]
        assert torch.equal(g["input_ids"][:, :cut], ref["input_ids"])
        assert torch.equal(g["attention_mask"][:, :cut], ref["attention_mask"])
        assert (g["input_ids"][:, cut:] == dm.pad_id).all() and (g["attention_mask"][:, cut:] == 0).all()
        assert torch.equal(g["target"], ref["target"]) and torch.equal(g["sample_id"], ref["sample_id"])


@pytest.mark.parametrize("stop_after", [0, 5, 33, 34, 50])  # 33 batches an epoch: 33 stops right at its end
def test_a_restored_device_batches_continues_exactly(demo_dir, stop_after):
    dm = _datamodule(demo_dir, on_device=True)
    reference = _take(dm.train_dataloader(), 100)
    first = dm.train_dataloader()
    seen = _take(first, stop_after)
    restored = dm.train_dataloader()  # fresh sampler, same device tensors
    restored.load_state_dict(first.state_dict())
    seen += _take(restored, 100 - stop_after)
    for g, w in zip(seen, reference, strict=True):
        _assert_same_batch(g, w)


def test_bad_pad_to_is_named(demo_dir):
    with pytest.raises(ValueError, match=r"data\.pad_to='longest' is not one of \('batch', 'bucket', 'max'\)"):
        TextBridgeDataModule(path=str(demo_dir), pad_to="longest")
    with pytest.raises(ConfigError, match=r"data\.pad_to.*'longest' is not one of batch, bucket, max, auto"):
        plan(smoke_config(demo_dir, "data.pad_to=longest"))
    with pytest.raises(ConfigError, match=r"data\.pad_multiple"):
        plan(smoke_config(demo_dir, "data.pad_multiple=0"))


@pytest.mark.parametrize("cuda_graph, backend, expected", [(False, "cpu", "bucket"), (True, "cpu", "max"),
                                                            (False, "cuda", "max"), (False, "mps", "bucket")])
def test_pad_to_auto_buckets_and_is_recorded_resolved(demo_dir, cuda_graph, backend, expected):
    from sweeplab.families.textbridge.device_batches import resolve_data, resolve_pad_to

    assert resolve_pad_to("auto", cuda_graph, backend) == expected
    assert resolve_pad_to("batch", cuda_graph, backend) == "batch"
    config = {"cuda_graph": cuda_graph, "backend": {"name": backend}}
    assert resolve_data({"pad_to": "auto"}, config)["pad_to"] == expected
    p = plan(smoke_config(demo_dir))  # the config's default is auto; the CPU has no CUDA graphs
    assert p.datamodule.pad_to == p.container["data"]["pad_to"] == "bucket"


@pytest.mark.parametrize("on_device", [False, True])
def test_buckets_bound_the_shapes_and_the_warmup_covers_every_one(demo_dir, on_device):
    reference = _take(_datamodule(demo_dir).train_dataloader(), 66)  # pad_to=batch, two epochs
    dm = _datamodule(demo_dir, pad_to="bucket", pad_multiple=16, on_device=on_device)
    got = _take(dm.train_dataloader(), 66)
    widths = set()
    for g, ref in zip(got, reference, strict=True):
        cut, width = ref["input_ids"].shape[1], g["input_ids"].shape[1]
        assert width == min(-(-cut // 16) * 16, dm.fixed_len)  # the next multiple of 16, at most the fixed width
        assert torch.equal(g["input_ids"][:, :cut], ref["input_ids"]) and (g["input_ids"][:, cut:] == dm.pad_id).all()
        assert torch.equal(g["attention_mask"][:, :cut], ref["attention_mask"]) and not g["attention_mask"][:, cut:].any()
        widths.add(width)
    assert len({r["input_ids"].shape[1] for r in reference}) > len(widths) > 1
    warmup = dm.shape_warmup_batches(66)  # the shapes of a run's first 66 batches, from the sampler and the lengths
    assert {tuple(b["input_ids"].shape) for b in warmup} == {(BATCH, w) for w in widths}
    for b in warmup:
        assert set(b) == set(KEYS) and b["attention_mask"].shape == b["input_ids"].shape
    reachable = {tuple(b["input_ids"].shape) for b in dm.shape_warmup_batches()}  # however long the run
    assert {(BATCH, w) for w in widths} <= reachable
    assert all(w % 16 == 0 or w == dm.fixed_len for _, w in reachable) and len(reachable) <= -(-dm.fixed_len // 16)


def test_no_warmup_shapes_for_per_batch_widths_one_for_max(demo_dir):
    assert _datamodule(demo_dir).shape_warmup_batches() == []
    dm = _datamodule(demo_dir, pad_to="max")
    assert [tuple(b["input_ids"].shape) for b in dm.shape_warmup_batches()] == [(BATCH, dm.fixed_len)]


# --- through Lightning -----------------------------------------------------------------------------


def _fit(demo_dir, monkeypatch, steps: int, *overrides) -> tuple[list[float], list[list[int]], set[str]]:
    """Train on the demo data; each step's loss, the sample ids it saw, and the kinds of train loader in use."""
    losses, ids, loaders = [], [], set()

    def recording_step(self, batch, batch_idx):
        loss = _TRAINING_STEP(self, batch, batch_idx)
        losses.append(float(loss))
        ids.append(batch["sample_id"].tolist())
        loaders.add(type(self.trainer.train_dataloader).__name__)
        return loss

    monkeypatch.setattr(TextBridgeTask, "training_step", recording_step)
    train(smoke_config(demo_dir, f"trainer.max_steps={steps}", *overrides))
    return losses, ids, loaders


def _history(client, experiment: str, key: str) -> list[tuple[int, float]]:
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def test_a_fit_on_device_gives_the_dataloader_losses(demo_dir, mlflow_uri, monkeypatch):
    # 24 steps of 16-sample batches cross the end of the first epoch (16 batches)
    loader = _fit(demo_dir, monkeypatch, 24, "data.on_device=false", "logger.experiment_name=loader")
    on_device = _fit(demo_dir, monkeypatch, 24, "data.on_device=true", "logger.experiment_name=on_device")
    assert (loader[2], on_device[2]) == ({"ResumableDataLoader"}, {"DeviceBatches"})
    assert on_device[1] == loader[1] and len(loader[1]) == 24
    torch.testing.assert_close(torch.tensor(on_device[0]), torch.tensor(loader[0]), rtol=0, atol=1e-6)
    client = MlflowClient(mlflow_uri)
    got, want = _history(client, "on_device", "train/loss"), _history(client, "loader", "train/loss")
    assert [s for s, _ in got] == [s for s, _ in want] and len(got) > 1
    torch.testing.assert_close(torch.tensor([v for _, v in got]), torch.tensor([v for _, v in want]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("stop", [12, 16])  # mid-epoch, and right at the end of the first epoch (16 batches)
def test_a_resumed_fit_on_device_sees_the_same_batches(stop, demo_dir, tmp_path, monkeypatch):
    common = ("data.on_device=true", "logger=none", f"checkpoint.every_n_steps={stop}")
    (tmp_path / "reference").mkdir()
    monkeypatch.chdir(tmp_path / "reference")  # checkpoints land in ./outputs/checkpoints
    ref_losses, ref_ids, _ = _fit(demo_dir, monkeypatch, 24, *common)

    # the run dies one step after its checkpoint at `stop` (same max_steps: the LR schedule depends on it)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(FAULT_RAISE_ENV, str(stop + 1))
    with pytest.raises(RuntimeError, match="injected failure"):
        _fit(demo_dir, monkeypatch, 24, *common)
    monkeypatch.delenv(FAULT_RAISE_ENV)
    ckpt = tmp_path / "outputs" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["global_step"] == stop and saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]

    rest_losses, rest_ids, _ = _fit(demo_dir, monkeypatch, 24, *common, f"resume={ckpt}")
    assert len(rest_ids) == 24 - stop and rest_ids == ref_ids[stop:]
    torch.testing.assert_close(torch.tensor(rest_losses), torch.tensor(ref_losses[stop:]), rtol=0, atol=0)


@pytest.mark.parametrize("saved_on_device", [True, False])
def test_resuming_with_the_other_data_path_is_refused_naming_the_setting(saved_on_device, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ("logger=none", "checkpoint.every_n_steps=4")
    _fit(demo_dir, monkeypatch, 6, *common, f"data.on_device={str(saved_on_device).lower()}")
    ckpt = tmp_path / "outputs" / "checkpoints" / "last.ckpt"
    saved = f"data.on_device={str(saved_on_device).lower()}"
    with pytest.raises(ConfigError, match=f"config error: data.on_device: .*saved with {saved}; resume with that"):
        _fit(demo_dir, monkeypatch, 6, *common, f"data.on_device={str(not saved_on_device).lower()}", f"resume={ckpt}")
