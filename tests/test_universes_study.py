"""The universes study: training and the baselines on the first N training universes
(train.universes), the points and their checks, the bootstrap ranges of every estimator, and the
gather's table and plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from baseline_shards import write_split
from study_tables import gather_study

from cosmocub.config import ConfigError, load_config
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.data.dataset import FirstUniverses, ShardDataset
from cosmocub.data.features import FEATURES_FILE, write_features
from cosmocub.evaluation.baselines import baseline_predictions, ridge_predictions
from cosmocub.evaluation.headline import comparison_table
from cosmocub.studies.accuracy import level_rows
from cosmocub.studies.engine import check_study, plan, point_config


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 2), ("test", 4)):
        write_split(folder / f"{split}.h5", rng, n, interleaved=True)
    write_features(folder, folder / FEATURES_FILE, num_workers=1)
    return folder


def test_first_universes_keeps_their_rows_in_shard_order(shards: Path) -> None:
    whole = ShardDataset(shards / "train.h5", mean=None, std=None)
    first = FirstUniverses(whole, 5)
    # Universe k's crops are rows k and 12 + k: those of universes 0-4, in the shard's order.
    assert first.rows.tolist() == [0, 1, 2, 3, 4, 12, 13, 14, 15, 16]
    assert len(first) == 10 and first.path == whole.path
    x, y = first[6]  # row 13: universe 1's second crop
    x13, y13 = whole[13]
    assert np.array_equal(x.numpy(), x13.numpy()) and np.array_equal(y.numpy(), y13.numpy())
    turned, _ = first[(6, 5)]  # an index tuple keeps its symmetry
    assert np.array_equal(turned.numpy(), whole[(13, 5)][0].numpy())
    assert not np.array_equal(turned.numpy(), x.numpy())
    with pytest.raises(ValueError, match=r"train.h5: key 'train.universes' is 13 but the shard "):
        FirstUniverses(whole, 13)


def test_baselines_are_fitted_on_the_same_universes(shards: Path) -> None:
    with h5py.File(shards / "train.h5") as f:
        y, where = f["y"][:].astype(np.float64), f["universe_index"][:]
    with h5py.File(shards / FEATURES_FILE) as f:
        train_pk, test_pk = f["train/pk"][:], f["test/pk"][:]
    keep = where < 4
    got = baseline_predictions(shards, "test", train_universes=4)
    np.testing.assert_allclose(got["mean"][0], y[keep].mean(0))
    np.testing.assert_allclose(got["pk"], ridge_predictions(train_pk[keep], y[keep], test_pk))
    # All twelve give other fits: the subset is what moved them.
    every = baseline_predictions(shards, "test")
    assert np.abs(every["mean"] - got["mean"]).max() > 1e-3
    np.testing.assert_allclose(every["mean"][0], y.mean(0))


def test_bootstrap_ranges_bracket_every_estimators_error() -> None:
    rng = np.random.default_rng(1)
    true = rng.uniform(-1, 1, size=(200, 1))
    preds = {
        est: true + rng.normal(0, s, size=true.shape)
        for est, s in (("cnn", 0.1), ("mean", 0.5), ("one_point", 0.3), ("pk", 0.2))
    }
    row = comparison_table(preds, true, ["p"], bootstrap=500)["p"]
    for est in preds:
        assert row[f"{est}_lo"] < row[est] < row[f"{est}_hi"]
        # ±1σ of a mean of 200 half-normal errors: |e| has mean σ√(2/π) and std
        # σ√(1 - 2/π), so about 0.76 MAE / √200 either side.
        half = (row[f"{est}_hi"] - row[f"{est}_lo"]) / 2
        ratio = math.sqrt(1 - 2 / math.pi) / math.sqrt(2 / math.pi)
        assert half == pytest.approx(ratio * row[est] / math.sqrt(200), rel=0.3)
    assert "cnn_lo" not in comparison_table(preds, true, ["p"])["p"]


def test_points_train_on_n_universes_at_equal_steps_and_check_the_config() -> None:
    cfg = load_config("config/universes.yaml")
    check_study(cfg, "universes")
    planned = plan(cfg, "universes")
    names = [p.point.name for p in planned]
    assert names[:3] == ["u30_lr0.0003", "u30_lr0.001", "u100_lr0.0003"] and len(names) == 8
    assert {p.shards for p in planned} == {str(cfg.results / "shards")}  # one set of shards
    derived = point_config(cfg, "universes", planned[-1].point)
    assert (derived.train.universes, derived.optimizer.lr) == (1000, 0.001)
    assert (derived.train.epochs, derived.train.max_steps_per_epoch) == (25, 30)
    # The science schedule (warm-up 1, decays at 10 and 13 of 15) at the same fractions of 25.
    assert derived.optimizer.warmup_epochs == 2 and derived.optimizer.decay_epochs == (17, 22)
    assert (
        derived.universes == cfg.universes and derived.train.run_name == "universes_u1000_lr0.001"
    )

    small = load_config(None)  # 48 universes: 34 in training
    with pytest.raises(ConfigError, match=r"1000 universes, but universes.count 48 gives the "):
        check_study(small, "universes")
    plan(small, "universes")  # planning alone (the workflow, at parse time) does not refuse
    few = load_config(None, overrides={"universes_study": {"train_universes": [3, 30]}})
    with pytest.raises(ConfigError, match=r"240 crops an epoch, but the smallest train_univ"):
        check_study(few, "universes")
    with pytest.raises(ConfigError, match=r"'universes_study.lrs': \[0.1, 0.1\] repeats"):
        load_config(None, overrides={"universes_study": {"lrs": [0.1, 0.1]}})


def test_the_budget_counts_the_global_batch_of_data_ranks_not_every_rank() -> None:
    # 4 ranks a node in pairs on one sample: 2 data ranks × 8 = a global batch of 16, so 30 steps
    # an epoch take 480 crops, which 60 universes of 8 crops give; counting every rank as a data
    # rank (4 × 8 = 32 a batch, 960 crops) refused it.
    values = {
        "universes": {"count": 200},
        "universes_study": {"train_universes": [60, 100]},
        "train": {"ranks_per_node": 4, "local_batch_size": 8},
    }
    split = load_config(None, overrides={**values, "parallel": {"spatial": 2}})
    assert (split.world_size, split.data_ranks, split.global_batch) == (4, 2, 16)
    check_study(split, "universes")
    unsplit = load_config(None, overrides=values)
    with pytest.raises(ConfigError, match=r"30 batches of 32 need 960 crops an epoch, but the "):
        check_study(unsplit, "universes")


def fake_metrics(cnn: float, pk: float) -> dict:
    """metrics.json with the CNN's MAE `cnn`·(j+1) on parameter j, the P(k) fit's `pk`, ranges
    ±10 %, and the gaussian head's coverages 0.6 / 0.9."""

    def table(scale: float) -> dict:
        out = {}
        for j, name in enumerate(NAME_PAR):
            row = {"cnn": scale * cnn * (j + 1), "mean": 0.5, "one_point": 0.4, "pk": pk}
            row |= {f"cnn_over_{e}": row["cnn"] / row[e] for e in ("mean", "one_point", "pk")}
            row |= {
                f"{e}_{s}": row[e] * f
                for e in ("cnn", "mean", "one_point", "pk")
                for s, f in (("lo", 0.9), ("hi", 1.1))
            }
            out[name] = row
        return out

    after = {
        "width68": {n: 0.2 for n in NAME_PAR},
        "coverage": {n: {"0.68": 0.6, "0.95": 0.9} for n in NAME_PAR},
    }
    return {
        "comparison": {
            "per_universe": table(1.0),
            "per_crop": table(2.0),
            "num_universes": 200,
            "num_crops": 1600,
        },
        "calibration": {"per_universe": {"after": after}, "per_crop": {"after": after}},
    }


def test_level_rows_give_every_estimator_with_its_range_and_the_coverage() -> None:
    rows = {(r["level"], r["parameter"]): r for r in level_rows(fake_metrics(0.1, 0.3))}
    s8 = rows["universe", "sigma_8"]
    assert s8["one_point_mae"] == 0.4 and s8["cnn_mae"] == pytest.approx(0.2)
    assert (s8["cnn_mae_lo"], s8["cnn_mae_hi"]) == pytest.approx((0.18, 0.22))
    assert (s8["coverage68"], s8["coverage95"], rows["universe", "mean"]["coverage68"]) == (
        0.6,
        0.9,
        pytest.approx(0.6),
    )


class RecordingTracker:
    def log_artifact(self, path, artifact_path=None) -> None:
        pass


def test_gather_picks_the_lr_per_n_and_plots_the_curve(tmp_path: Path) -> None:
    cfg = load_config(
        "config/universes.yaml",
        overrides={"universes_study": {"train_universes": [30, 300], "lrs": [0.001, 0.003]}},
    )
    # At 30 the larger lr validates better, at 300 the smaller; the CNN improves with N.
    points = {
        "u30_lr0.001": (0.3, 1.2),
        "u30_lr0.003": (0.25, 1.0),
        "u300_lr0.001": (0.1, 0.4),
        "u300_lr0.003": (0.4, 0.8),
    }
    for name, (cnn, loss) in points.items():
        folder = tmp_path / name
        (folder / "eval").mkdir(parents=True)
        (folder / "run").mkdir()
        (folder / "eval/metrics.json").write_text(json.dumps(fake_metrics(cnn, 0.3)))
        (folder / "run/train_summary.json").write_text(json.dumps({"steps": 750}))
        (folder / "run/metrics.jsonl").write_text(json.dumps({"step": 750, "val_loss": loss}))
    out = {
        "tsv": tmp_path / "points.tsv",
        "png": tmp_path / "universes.png",
        "md": tmp_path / "summary.md",
    }
    gather_study(cfg, "universes", tmp_path, tracker=RecordingTracker())
    with open(out["tsv"]) as f:
        on_disk = list(csv.DictReader(f, delimiter="\t"))
    picked = {(r["point"], r["level"], r["parameter"]): r for r in on_disk if r["selected"] == "1"}
    assert {p for p, _, _ in picked} == {"u30_lr0.003", "u300_lr0.001"}
    u300 = picked["u300_lr0.001", "universe", "Omega_m"]
    assert (u300["train_universes"], u300["lr_grid"], u300["count"]) == (
        "300",
        "0.001 0.003",
        "200",
    )
    assert float(u300["cnn_over_pk"]) == pytest.approx(0.1 / 0.3, rel=1e-5)
    assert float(u300["pk_mae_hi"]) == pytest.approx(0.33) and u300["coverage95"] == "0.9"
    assert out["png"].stat().st_size > 20_000
    assert out["md"].read_text().startswith("## Study `universes`")


def test_val_universes_keeps_every_sample_of_the_first_validation_universes(
    tmp_path: Path,
) -> None:
    # train.val_universes: the first N universes of val.h5 (source_files order), every one of
    # their samples, wherever the rows lie; more than the shard holds is a one-line error.
    path = tmp_path / "val.h5"
    write_split(path, np.random.default_rng(3), universes=5, crops=3, interleaved=True)
    subset = FirstUniverses(ShardDataset(path, mean=None, std=None), 2, key="train.val_universes")
    assert sorted(subset.rows.tolist()) == [0, 1, 5, 6, 10, 11]
    with pytest.raises(ValueError, match=r"val.h5: key 'train.val_universes' is 6 but the shard"):
        FirstUniverses(ShardDataset(path, mean=None, std=None), 6, key="train.val_universes")
    assert load_config(None, overrides={"train": {"val_universes": 2}}).train.val_universes == 2
    with pytest.raises(ConfigError, match=r"train.val_universes"):
        load_config(None, overrides={"train": {"val_universes": 0}})
