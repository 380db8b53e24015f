"""Does a trained `model.pooled.tap_ridge` network compute anything its input tap lacks? Ridges on
its own features, fitted to what the tap's ridge leaves on the training universes, scored on
validation (docs/known_answer.md, "Whole boxes: what the network adds beside the ridge").

    python benchmarks/beyond_the_tap.py --run /tmp/wb/run0 --shards /tmp/wb/shards

One pass of the model (eval mode, one symmetry) over the train, val and test shards keeps,
per sample, the input tap's statistics, the blocks' pooled moments (what `model.pooled` reads
beside the tap, before its normalisation) and the last hidden layer. The start is the model's
own fixed ridge on the tap (its means at step 0). A second stage, a RidgeCV with a penalty per
parameter on each feature set (standardised), is fitted to the start's training residual; its
validation and test MAE per universe (unitPar) say what that set adds. A set holding nothing
beyond the tap takes the largest penalty and leaves the MAE where the start had it. The model's
own MAE, the same pass, is the last row. Minutes on 2 cores for 2,200 whole 64³ boxes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch.utils.data import DataLoader

from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.data.dataset import open_split
from cosmocub.evaluation.baselines import usable_columns
from cosmocub.models.heads import split_output
from cosmocub.models.model_factory import load_model_file

SPLITS = ("train", "val", "test")
PENALTIES = np.logspace(-2, 6, 17)


def model_features(model: torch.nn.Module, dataset, batch_size: int) -> dict[str, np.ndarray]:
    """{"start", "tap", "blocks", "hidden", "model", "true"}: (N, ·) over `dataset` in order."""
    kept: dict[str, torch.Tensor] = {}
    hooks = [
        model.pooled.register_forward_pre_hook(lambda _m, args: kept.update(stats=args[0])),
        model.head[-2].register_forward_hook(lambda _m, _a, out: kept.update(hidden=out)),
    ]
    rows: dict[str, list[np.ndarray]] = {}
    scale, p = model.config.output_scale, model.config.num_outputs
    with torch.inference_mode():
        for x_bcdhw, y_bp in DataLoader(dataset, batch_size=batch_size):
            out = model(x_bcdhw.float())
            mean = split_output(out, model.config)[0] if model.config.gaussian else out
            tap = kept["stats"][0]
            batch = {
                "start": torch.tanh(model.pooled.ridge(tap)) * scale,
                "tap": tap,
                "blocks": torch.cat(kept["stats"][1:], dim=1),
                "hidden": kept["hidden"],
                "model": mean[:, :p],
                "true": y_bp,
            }
            for name, value in batch.items():
                rows.setdefault(name, []).append(value.double().numpy())
    for hook in hooks:
        hook.remove()
    return {name: np.concatenate(parts) for name, parts in rows.items()}


def second_stage(
    train: dict, targets: list[dict], name: str
) -> tuple[np.ndarray, list[np.ndarray]]:
    """(per-parameter penalty, each target's start + the stage's prediction) for feature set
    `name`, fitted once on `train`."""
    keep = usable_columns(train[name])
    fit = make_pipeline(StandardScaler(), RidgeCV(alphas=PENALTIES, alpha_per_target=True))
    fit.fit(train[name][:, keep], train["true"] - train["start"])
    return fit[-1].alpha_, [t["start"] + fit.predict(t[name][:, keep]) for t in targets]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a training run (model.pt)")
    parser.add_argument("--shards", type=Path, required=True, help="its shards")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    before, start = " ".join(f"{x:.2f}" for x in os.getloadavg()), time.perf_counter()
    model = load_model_file(args.run / "model.pt").eval()
    if model.config.name != "cosmoflow" or not model.config.pooled.tap_ridge:
        parser.error(f"{args.run}/model.pt: a CosmoFlow with model.pooled.tap_ridge is needed")
    feats = {
        split: model_features(model, open_split(args.shards, split, model.config), args.batch_size)
        for split in SPLITS
    }
    names = NAME_PAR[: model.config.num_outputs]
    print(
        f"\n{args.run}/model.pt on {args.shards}: MAE per universe (unitPar), "
        f"{len(feats['train']['true'])} training universes\n"
    )
    print("| estimate | values | " + " | ".join(f"val {n}" for n in names) + " | test mean |")
    print("|---|---|" + "---|" * (len(names) + 1))

    def row(label: str, width: int | str, val: np.ndarray, test: np.ndarray) -> None:
        cells = " | ".join(f"{v:.4f}" for v in np.abs(val - feats["val"]["true"]).mean(0))
        test_mae = np.abs(test - feats["test"]["true"]).mean()
        print(f"| {label} | {width} | {cells} | {test_mae:.4f} |")

    row("the tap's ridge (the model at step 0)", "—", feats["val"]["start"], feats["test"]["start"])
    for name in ("tap", "blocks", "hidden"):
        penalty, (val, test) = second_stage(feats["train"], [feats["val"], feats["test"]], name)
        label = f"+ a ridge on {name} (penalty {' / '.join(f'{a:.0e}' for a in penalty)})"
        row(label, feats["train"][name].shape[1], val, test)
    row("the trained model", "—", feats["val"]["model"], feats["test"]["model"])
    took = time.perf_counter() - start
    print(f"\n{took:.0f} s; load {before} → {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
