"""The study engine, through the sample-size study: points and their configs and shards, the
error table, the gather (TSV, plot, report section, MLflow artifacts) and CLI errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from cosmocub import cli
from cosmocub.config import ConfigError, from_values, load_config
from cosmocub.studies.engine import Point, gather, plan, point_values
from cosmocub.studies.sample_size import STUDY, size_config_values, study_rows


def test_size_configs_change_only_the_sample_and_its_split() -> None:
    cfg = load_config(None)  # sizes [16, 32, 64], spatial [1, 1, 2] on 64³ universes
    values = size_config_values(cfg, 64)
    derived = from_values(values)
    assert derived.preprocess.sample_size == derived.model.input_size == 64
    assert derived.parallel.split_dhw == (2, 1, 1) and derived.train.nproc_per_node == 2
    assert derived.train.run_name == "sample_size_64"
    assert derived.optimizer == cfg.optimizer and derived.universes == cfg.universes
    assert derived.train.epochs == cfg.train.epochs and derived.seed == cfg.seed
    assert from_values(size_config_values(cfg, 16)).parallel.spatial == 1
    with pytest.raises(ConfigError, match=r"'sample_size_study.sizes': 8 is not one of"):
        size_config_values(cfg, 8)
    odd = load_config(None, overrides={"sample_size_study": {"sizes": [16, 24], "spatial": [1, 1]}})
    with pytest.raises(ConfigError, match=r"24 does not divide universes.size 64"):
        size_config_values(odd, 24)
    with pytest.raises(ConfigError, match=r"'sample_size_study.spatial': 1 values for 2 sizes"):
        load_config(None, overrides={"sample_size_study": {"sizes": [16, 32], "spatial": [1]}})


def test_rows_per_sample_and_per_universe() -> None:
    # Two test universes, two samples each; targets (P = 4) constant within a universe.
    true = np.array([[0.5, 0, 0, 0], [0.5, 0, 0, 0], [-0.5, 0, 0, 0], [-0.5, 0, 0, 0]])
    # Per sample the errors are ±0.2 around the truth; they cancel in each universe's mean.
    pred = true + np.array([[0.2, 0, 0, 0.1], [-0.2, 0, 0, 0.1], [0.2, 0, 0, 0], [-0.2, 0, 0, 0]])
    rows = study_rows(
        {8: {"pred_unit": pred, "true_unit": true, "universe_index": np.array([3, 3, 7, 7])}},
        spatial={8: 2},
        train_mean_unit={8: np.array([0.1, 0, 0, 0])},
    )
    table = {(r["level"], r["parameter"]): r for r in rows}
    assert len(rows) == 2 * 5
    sample, universe = table["sample", "Omega_m"], table["universe", "Omega_m"]
    assert (sample["count"], universe["count"]) == (4, 2)
    assert sample["mae"] == pytest.approx(0.2) and universe["mae"] == pytest.approx(0.0)
    # The baseline answers 0.1 everywhere: |0.5 - 0.1| and |-0.5 - 0.1|.
    assert sample["baseline_mae"] == pytest.approx(0.5) == universe["baseline_mae"]
    assert sample["mae_ratio"] == pytest.approx(0.4)
    assert table["sample", "H_0"]["mae"] == pytest.approx(0.05)
    assert table["universe", "H_0"]["mae"] == pytest.approx(0.05)
    assert table["sample", "mean"]["mae"] == pytest.approx((0.2 + 0 + 0 + 0.05) / 4)
    assert table["sample", "mean"]["spatial"] == 2


class RecordingTracker:
    def __init__(self) -> None:
        self.artifacts: list[str] = []

    def log_artifact(self, path, artifact_path=None) -> None:
        self.artifacts.append(f"{artifact_path}/{Path(path).name}")


def write_point(folder: Path, pred: np.ndarray, true: np.ndarray, universe: np.ndarray) -> None:
    """What study_point and study_evaluate leave in a point's folder."""
    (folder / "eval").mkdir(parents=True)
    (folder / "run").mkdir()
    np.savez(
        folder / "eval/predictions.npz", pred_unit=pred, true_unit=true, universe_index=universe
    )
    (folder / "eval/metrics.json").write_text(json.dumps({"train_mean_unit": [0.0] * 4}))
    (folder / "run/train_summary.json").write_text(json.dumps({"mlflow_run_id": None}))


def test_gather_writes_tsv_plot_and_report_section(tmp_path: Path) -> None:
    cfg = load_config(None, overrides={"sample_size_study": {"sizes": [16, 32], "spatial": [1, 2]}})
    rng = np.random.default_rng(0)
    true = np.repeat(rng.uniform(-1, 1, size=(3, 4)), 4, axis=0)  # 3 universes × 4 samples
    universe = np.repeat(np.arange(3), 4)
    write_point(tmp_path / "16", true + 0.3 * rng.normal(size=true.shape), true, universe)
    write_point(tmp_path / "32", true + 0.1 * rng.normal(size=true.shape), true, universe)
    tracker = RecordingTracker()
    out = {k: tmp_path / f"s.{k}" for k in ("tsv", "png", "md")}
    rows = gather(
        cfg,
        "sample_size",
        folder=tmp_path,
        out_tsv=out["tsv"],
        out_png=out["png"],
        out_summary=out["md"],
        tracker=tracker,
    )
    with open(out["tsv"]) as f:
        on_disk = list(csv.DictReader(f, delimiter="\t"))
    assert len(on_disk) == len(rows) == 2 * 2 * 5
    assert [r["spatial"] for r in on_disk if r["parameter"] == "mean"] == ["1", "1", "2", "2"]
    # Less noise at 32: lower error, at both levels; the same metric names for both points.
    metrics = {p: STUDY.point_metrics([r for r in rows if r["sample_size"] == p]) for p in (16, 32)}
    assert metrics[16].keys() == metrics[32].keys()
    for level in ("sample", "universe"):
        assert metrics[32][f"{level}_mae_mean"] < metrics[16][f"{level}_mae_mean"]
    assert tracker.artifacts == [f"sample_size_study/s.{k}" for k in ("tsv", "png", "md")]
    assert out["png"].stat().st_size > 10_000
    section = out["md"].read_text()
    assert (
        section.startswith("## Study `sample_size`") and "![Study `sample_size`](s.png)" in section
    )
    assert section.count("\n| 32 | 32 | 2 | universe |") == 5  # 4 parameters and their mean


def test_points_share_shards_and_may_not_touch_fixed_sections() -> None:
    cfg = load_config(None)  # sizes [16, 32, 64]; the base run's crops are 32³
    planned = {p.point.name: p for p in plan(cfg, "sample_size")}
    assert planned["32"].shards == str(cfg.results / "shards")  # the base run's own
    assert planned["16"].shards.endswith(planned["16"].shard_key)
    assert planned["16"].shard_key != planned["64"].shard_key
    assert (planned["16"].ranks, planned["64"].ranks) == (1, 2)
    with pytest.raises(ConfigError, match=r"overrides \['universes'\], which every point shares"):
        Point(name="x", overrides={"universes": {"count": 2}})
    with pytest.raises(
        ConfigError, match=r"study sample_size point 16: key 'model': .*'bad' was unexpected"
    ):
        point_values(cfg, "sample_size", Point(name="16", overrides={"model": {"bad": 1}}))


def test_cli_study_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["study-gather", "--study", "nope", "--dir", str(tmp_path)]) == 2
    known = "network, sample_size, scaling, step_time"
    assert f"study 'nope': unknown ({known})" in capsys.readouterr().err
    args = ["study-point-config", "--study", "sample_size", "--point", "7", "--out", "o.yaml"]
    assert cli.main(args) == 2
    assert "study 'sample_size': no point '7' (points: 16, 32, 64)" in capsys.readouterr().err
    args = ["study-gather", "--study", "sample_size", "--dir", str(tmp_path)]
    assert cli.main([*args, "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml: config file not found" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_training_row_means_the_steps_after_the_first_epoch(tmp_path: Path) -> None:
    from cosmocub.studies.engine import PointOutputs, training_row

    run = tmp_path / "run"
    run.mkdir()
    epochs = [  # epoch 0 holds start-up costs and is left out; epochs 1 and 2 are weighted 4 : 2
        {"step": 6, "val_loss": 2.0, "time_compute_s": 9.0, "time_exchange_s": 9.0},
        {"step": 10, "val_loss": 1.5, "time_compute_s": 0.3, "time_exchange_s": 0.1},
        {"step": 12, "val_loss": 1.0, "time_compute_s": 0.6, "time_exchange_s": 0.4},
    ]
    for e in epochs:
        e |= {"time_momentum_sync_s": 0.0, "comm_bytes_per_step": 100.0}
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    summary = {"world_size": 4, "data_parallel": 2, "spatial_parallel": 2, "steps": 12}
    (run / "train_summary.json").write_text(json.dumps(summary))
    (tmp_path / "point.json").write_text(json.dumps({"nodes": 2, "cores_per_rank": 1}))
    row = training_row(PointOutputs(point=Point(name="p", overrides={}), folder=tmp_path))
    assert row["compute_s"] == pytest.approx((4 * 0.3 + 2 * 0.6) / 6)
    assert row["exchange_s"] == pytest.approx((4 * 0.1 + 2 * 0.4) / 6)
    assert row["step_s"] == pytest.approx(row["compute_s"] + row["exchange_s"])
    assert (row["data"], row["spatial"], row["nodes"], row["cores_per_rank"]) == (2, 2, 2, 1)
    assert (row["steps"], row["final_val_loss"], row["comm_bytes_per_step"]) == (12, 1.0, 100.0)
