"""Why the CNN does not beat the P(k) fit: the recipe's parts measured one at a time on the
validation split (never test), beside flexible fits on the field statistics. Two tables:

(a) what the statistics hold, no training: validation MAE per crop and per universe of
    predict-the-mean, evaluation's ridge fits (one-point; P(k)), a ridge on both, and a kernel
    ridge (RBF) on both whose penalty and width are chosen by cross-validation grouped by universe
    (crops of one universe never straddle a fold). If the flexible fit does no better than the
    ridge, the ridge has taken what those statistics hold.
(a') which parameter combinations the statistics measure at all: per universe, validation MAE ÷
    predict-the-mean of ridge fits (P(k); P(k) + one-point) to Ω_m, H_0, their sum (in unitPar
    ≈ 10·ln(Ω_m h) + const: Ω_m h sets the spectrum's shape) and difference, σ_8 and n_s;
(b) the CNN: the config's recipe and variants of it (capacity: `base_filters`; augmentation off;
    twice the steps with the schedule stretched; the pooled branch, model.pooled, with the
    mean and std of the input and of every block joined at the head's input or at its last
    hidden layer), each trained on the config's shards, predicted
    on validation with the config's test-time symmetries; MAE per crop and per universe (a
    universe's crops averaged, for every estimator alike) and ÷ the P(k) fit's.

Variants train one after another in --out/<variant>/ and are reused if their model.pt exists.

    python benchmarks/why_cnn_vs_pk.py --config config/science.yaml \
        --shards results-science/shards --out results-science/why \
        --variants base filters8 filters32 no_augment
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import yaml
from sklearn.kernel_ridge import KernelRidge
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from cosmocub.config import deep_merge, load_config, resolve, write_config
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.data.dataset import open_split
from cosmocub.data.features import FEATURES_FILE, read_features
from cosmocub.evaluation import uncertainty as unc
from cosmocub.evaluation.baselines import baseline_predictions, ridge_predictions, usable_columns
from cosmocub.evaluation.split_predictions import split_predictions
from cosmocub.models.model_factory import load_model_file
from cosmocub.optim.schedule import stretched


def twice_the_steps(raw: dict[str, Any]) -> dict[str, Any]:
    """Twice the epochs, warm-up and decay epochs of the recipe: more steps, same shape."""
    cfg = load_config(None, overrides=raw)
    return {"train": {"epochs": cfg.train.epochs * 2}, "optimizer": stretched(cfg.optimizer, 2)}


def variants(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "base": {},
        "filters8": {"model": {"base_filters": 8}},
        "filters32": {"model": {"base_filters": 32}},
        "no_augment": {"train": {"augment": False}},
        "steps_x2": twice_the_steps(raw),
        "pooled": {"model": {"pooled": {"stats": "mean_std"}}},
        "pooled_last_hidden": {"model": {"pooled": {"stats": "mean_std", "join": "last_hidden"}}},
    }


def load_split(shards: Path, split: str) -> dict[str, np.ndarray]:
    """A split's targets "y", "universe_index" and statistics: "pk", and "both" (P(k) and the
    one-point statistics side by side)."""
    with h5py.File(shards / f"{split}.h5", "r") as f:
        out = {"y": f["y"][:].astype(np.float64), "universe_index": f["universe_index"][:]}
    features = read_features(shards / FEATURES_FILE, split)
    out["pk"] = features["pk"]
    out["both"] = np.concatenate([features["pk"], features["one_point"]], axis=1)
    return out


def statistics_fits(train: dict[str, np.ndarray], val: dict[str, np.ndarray]) -> dict:
    """Validation predictions of ridge and kernel-ridge fits on P(k) + one-point statistics,
    fitted on train (the evaluation's own baselines come from `baseline_predictions`)."""
    keep = usable_columns(train["both"])
    x_train, x_val = train["both"][:, keep], val["both"][:, keep]
    kernel = GridSearchCV(
        make_pipeline(StandardScaler(), KernelRidge(kernel="rbf")),
        {
            "kernelridge__alpha": np.logspace(-5, 1, 7),
            # In units of 1/features (the RBF's natural width on standardised inputs).
            "kernelridge__gamma": np.logspace(-4, 0.5, 10) / x_train.shape[1],
        },
        cv=GroupKFold(n_splits=5),
        scoring="neg_mean_absolute_error",
    )
    kernel.fit(x_train, train["y"], groups=train["universe_index"])
    chosen = {k.split("__")[1]: f"{v:.3g}" for k, v in kernel.best_params_.items()}
    print(f"kernel ridge on {x_train.shape[1]} statistics: chosen {chosen}", flush=True)
    x_val = np.where(np.isfinite(x_val), x_val, x_train.mean(axis=0))
    return {
        "ridge_pk_1pt": ridge_predictions(train["both"], train["y"], val["both"]),
        "kernel_pk_1pt": kernel.predict(x_val),
    }


# unitPar weights (Ω_m, σ_8, n_s, H_0) of the combinations of table (a').
COMBINATIONS = {
    "Ω_m": (1, 0, 0, 0),
    "H_0": (0, 0, 0, 1),
    "Ω_m + H_0 (Ω_m h)": (1, 0, 0, 1),
    "Ω_m − H_0": (1, 0, 0, -1),
    "σ_8": (0, 1, 0, 0),
    "n_s": (0, 0, 1, 0),
}


def combination_table(train: dict[str, np.ndarray], val: dict[str, np.ndarray]) -> None:
    """Table (a'): per universe, validation MAE ÷ predict-the-mean of a ridge per combination."""
    where = val["universe_index"]
    sets = {"P(k)": "pk", "P(k) + one-point": "both"}
    print("\nper universe, validation MAE ÷ predict-the-mean of a ridge fit to each combination")
    print("| combination | " + " | ".join(sets) + " |")
    print("|---|" + "---|" * len(sets))
    for name, weights in COMBINATIONS.items():
        w = np.array(weights, dtype=np.float64)
        t_train = (train["y"] @ w)[:, None]
        t_val = unc.mean_per_universe((val["y"] @ w)[:, None], where)[:, 0]
        mean_mae = np.abs(t_train.mean() - t_val).mean()
        cells = []
        for key in sets.values():
            pred = ridge_predictions(train[key], t_train, val[key])
            mae = np.abs(unc.mean_per_universe(pred, where)[:, 0] - t_val).mean()
            cells.append(f"{mae / mean_mae:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def mae_table(preds: dict[str, np.ndarray], true: np.ndarray, where: np.ndarray) -> dict:
    """Per estimator: MAE per parameter per crop and per universe (crops averaged)."""
    true_u = unc.mean_per_universe(true, where)
    out = {}
    for name, pred in preds.items():
        pred_u = unc.mean_per_universe(pred, where)
        out[name] = {
            "crop": np.abs(pred - true).mean(0).tolist(),
            "universe": np.abs(pred_u - true_u).mean(0).tolist(),
        }
    return out


def train_variant(base_raw: dict, name: str, overrides: dict, shards: Path, out: Path) -> Path:
    run_dir = out / name / "run"
    if (run_dir / "model.pt").is_file():
        print(f"{name}: reusing {run_dir}", flush=True)
        return run_dir
    raw = deep_merge(copy.deepcopy(base_raw), overrides)
    raw = deep_merge(raw, {"train": {"run_name": f"why_{name}"}})
    config_path = out / name / "config.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    write_config(resolve(raw, source=f"variant {name}"), config_path)
    start = time.perf_counter()
    cmd = ["cosmocub", "train", "--shards", str(shards), "--out", str(run_dir)]
    with open(out / name / "train.log", "w") as log:
        subprocess.run(
            [*cmd, "--config", str(config_path)], check=True, stdout=log, stderr=subprocess.STDOUT
        )
    print(f"{name}: trained in {time.perf_counter() - start:.0f} s", flush=True)
    return run_dir


def cnn_validation(run_dir: Path, shards: Path, symmetries: int) -> np.ndarray:
    model = load_model_file(run_dir / "model.pt")
    val = open_split(shards, "val", model.config)
    return split_predictions(model, val, batch_size=16, symmetries=symmetries)["mean"]


def print_table(rows: dict[str, dict], reference: dict) -> None:
    short = ("Ω_m", "σ_8", "n_s", "H_0")
    for level in ("crop", "universe"):
        print(f"\nvalidation MAE (unitPar) per {level}; ÷ P(k) ridge in brackets")
        print("| estimator | " + " | ".join(short) + " | mean |")
        print("|---|" + "---|" * (len(short) + 1))
        ref = np.array(reference[level])
        for name, row in rows.items():
            mae = np.array(row[level])
            cells = [f"{m:.3f} ({m / r:.2f})" for m, r in zip(mae, ref, strict=True)]
            print(f"| {name} | " + " | ".join(cells) + f" | {mae.mean():.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="*", default=["base"])
    args = parser.parse_args(argv)
    base_raw = yaml.safe_load(args.config.read_text()) or {}
    cfg = load_config(args.config)
    known = variants(base_raw)
    unknown = [v for v in args.variants if v not in known]
    if unknown:
        print(f"--variants: unknown {unknown} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    train, val = load_split(args.shards, "train"), load_split(args.shards, "val")
    true, where = val["y"], val["universe_index"]
    preds = dict(baseline_predictions(args.shards, "val"))
    preds |= statistics_fits(train, val)
    for name in args.variants:
        run_dir = train_variant(base_raw, name, known[name], args.shards, args.out)
        preds[f"cnn_{name}"] = cnn_validation(run_dir, args.shards, cfg.evaluate.symmetries)
    rows = mae_table(preds, true, where)
    print(f"{len(true)} validation crops of {len(np.unique(where))} universes; {NAME_PAR}")
    print_table(rows, rows["pk"])
    combination_table(train, val)
    (args.out / "why.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
