import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from sweeplab.families.pagating_lm.alpha import AlphaScheduleCallback
from sweeplab.models.gpt import GPT, GPTConfig

V, T = 50, 8


class MemoryLogger(Logger):
    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


class TinyLM(L.LightningModule):
    def __init__(self, alpha="cosine", schedule_steps=4):
        super().__init__()
        config = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, d_model=16, d_ff=32, alpha=alpha)
        config.unit_options = {"schedule_steps": schedule_steps} if alpha in ("cosine", "linear") else {}
        self.model = GPT(config)
        self.seen_alpha: list[float] = []

    def training_step(self, batch, batch_idx):
        self.seen_alpha.append(self.model.alpha_values()["layer_0"])
        (ids,) = batch
        logits = self.model(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(module, max_steps, callback, logger=None, ckpt_path=None, **trainer_kwargs):
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=logger if logger is not None else False,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
        **trainer_kwargs,
    )
    data = DataLoader(TensorDataset(torch.randint(0, V, (64, T + 1))), batch_size=4)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer


def test_scheduled_alpha_follows_optimizer_steps_and_is_logged():
    module = TinyLM(alpha="cosine", schedule_steps=4)
    logger = MemoryLogger()
    fit(module, 5, AlphaScheduleCallback(log_every_n_steps=2), logger=logger)
    assert module.seen_alpha == pytest.approx([1.0, 0.853553, 0.5, 0.146447, 0.0], abs=1e-5)
    logged = {step: m for step, m in logger.rows if any(k.startswith("alpha/") for k in m)}
    assert sorted(logged) == [0, 2, 4]
    assert logged[2] == pytest.approx({"alpha/layer_0": 0.5, "alpha/layer_1": 0.5})


def test_gradient_accumulation_steps_once_per_optimizer_step():
    module = TinyLM(alpha="linear", schedule_steps=4)
    fit(module, 2, AlphaScheduleCallback(), accumulate_grad_batches=2)
    assert module.seen_alpha == pytest.approx([0.0, 0.0, 0.25, 0.25])


def test_fixed_and_learnable_alpha_are_logged_not_stepped():
    module = TinyLM(alpha="learnable")
    logger = MemoryLogger()
    fit(module, 3, AlphaScheduleCallback(log_every_n_steps=1), logger=logger)
    logged = [m["alpha/layer_0"] for _, m in logger.rows if "alpha/layer_0" in m]
    assert len(logged) == 4 and logged[0] == pytest.approx(0.5)


@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint")
def test_resume_restores_the_schedule_position(tmp_path):
    module = TinyLM(alpha="cosine", schedule_steps=4)
    trainer = fit(module, 2, AlphaScheduleCallback())
    trainer.save_checkpoint(tmp_path / "step2.ckpt")
    # a checkpoint whose α buffers disagree with its step count: on_train_start puts α where global_step says
    checkpoint = torch.load(tmp_path / "step2.ckpt", weights_only=False)
    for key in checkpoint["state_dict"]:
        if key.endswith("alpha_gate.value"):
            checkpoint["state_dict"][key].fill_(1.0)
    torch.save(checkpoint, tmp_path / "stale.ckpt")
    resumed = TinyLM(alpha="cosine", schedule_steps=4)
    fit(resumed, 4, AlphaScheduleCallback(), ckpt_path=tmp_path / "stale.ckpt")
    assert resumed.seen_alpha == pytest.approx([0.5, 0.146447], abs=1e-5)


def test_bad_interval():
    with pytest.raises(ValueError, match="log_every_n_steps"):
        AlphaScheduleCallback(log_every_n_steps=0)
