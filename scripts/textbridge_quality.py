"""How well a trained TextBridge checkpoint generalises: cos on the training and the validation split, the mean-target
floor, P@1 and MRR (docs/models.md#quality-on-the-real-teacher).

    python scripts/textbridge_quality.py CHECKPOINT [--data data/textbridge_demo] [--val-fraction 0.1] [--seed 0]

The split is the training run's (the data module's seeded split: same seed, same val_fraction, same split). The
mean-target floor is the validation cos of a "model" that answers every sentence with the mean training target: a
student must beat it to have learnt anything about the sentence. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json

import torch

from sweeplab.families.loading import load_model
from sweeplab.families.textbridge.data import TextBridgeDataModule
from sweeplab.families.textbridge.task import cosine_per_sample, retrieval_metrics


@torch.no_grad()
def embed(model, dm: TextBridgeDataModule, dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """(student z, teacher t) for every sample of `dataset`, in its order."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=False, collate_fn=dm.collate)
    zs, ts = [], []
    for batch in loader:
        zs.append(model(batch["input_ids"], batch["attention_mask"]).float())
        ts.append(batch["target"].float())
    return torch.cat(zs), torch.cat(ts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--data", default="data/textbridge_demo", help="the prepared directory it was trained on")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    loaded = load_model(args.checkpoint, expect_family="textbridge")
    dm = TextBridgeDataModule(
        demo_dir=args.data, val_fraction=args.val_fraction, seed=args.seed, max_len=loaded.model_config.max_len
    )
    dm.setup()
    z_train, t_train = embed(loaded.model, dm, dm.train_dataset)
    z_val, t_val = embed(loaded.model, dm, dm.val_dataset)
    p_at_1, mrr = retrieval_metrics(z_val, t_val)
    train_p_at_1, _ = retrieval_metrics(z_train, t_train)
    mean_target = t_train.mean(0, keepdim=True).expand_as(t_val)
    result = {
        "checkpoint": str(args.checkpoint),
        "global_step": loaded.global_step,
        "n_train": len(t_train),
        "n_val": len(t_val),
        "train_cos": round(cosine_per_sample(z_train, t_train).mean().item(), 4),
        "val_cos": round(cosine_per_sample(z_val, t_val).mean().item(), 4),
        "mean_target_floor": round(cosine_per_sample(mean_target, t_val).mean().item(), 4),
        "val_p_at_1": round(p_at_1.item(), 4),
        "val_mrr": round(mrr.item(), 4),
        "train_p_at_1": round(train_p_at_1.item(), 4),
    }
    result["val_cos_above_floor"] = round(result["val_cos"] - result["mean_target_floor"], 4)
    result["train_minus_val_cos"] = round(result["train_cos"] - result["val_cos"], 4)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
