"""The sample-size study's pieces: per-size configs, the error table and what reaches MLflow."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from cosmocub import cli
from cosmocub.config import ConfigError, from_values, load_config
from cosmocub.studies.sample_size import run_study, size_config_values, study_rows


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
        self.metrics: dict[str, float] = {}
        self.artifacts: list[str] = []

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.update(metrics)

    def log_artifact(self, path, artifact_path=None) -> None:
        self.artifacts.append(f"{artifact_path}/{Path(path).name}")


def write_eval(folder: Path, pred: np.ndarray, true: np.ndarray, universe: np.ndarray) -> Path:
    import json

    folder.mkdir(parents=True)
    np.savez(folder / "predictions.npz", pred_unit=pred, true_unit=true, universe_index=universe)
    (folder / "metrics.json").write_text(json.dumps({"train_mean_unit": [0.0, 0.0, 0.0, 0.0]}))
    return folder


def test_run_study_writes_tsv_plot_and_logs(tmp_path: Path) -> None:
    cfg = load_config(None, overrides={"sample_size_study": {"sizes": [16, 32], "spatial": [1, 2]}})
    rng = np.random.default_rng(0)
    true = np.repeat(rng.uniform(-1, 1, size=(3, 4)), 4, axis=0)  # 3 universes × 4 samples
    universe = np.repeat(np.arange(3), 4)
    evals = {
        16: write_eval(tmp_path / "16", true + 0.3 * rng.normal(size=true.shape), true, universe),
        32: write_eval(tmp_path / "32", true + 0.1 * rng.normal(size=true.shape), true, universe),
    }
    tracker = RecordingTracker()
    rows = run_study(
        cfg,
        eval_dirs=evals,
        out_tsv=tmp_path / "s.tsv",
        out_png=tmp_path / "s.png",
        tracker=tracker,
    )
    with open(tmp_path / "s.tsv") as f:
        on_disk = list(csv.DictReader(f, delimiter="\t"))
    assert len(on_disk) == len(rows) == 2 * 2 * 5
    assert [r["spatial"] for r in on_disk if r["parameter"] == "mean"] == ["1", "1", "2", "2"]
    # Less noise at 32: lower error, at both levels.
    for level in ("sample", "universe"):
        assert tracker.metrics[f"{level}_mae_mean_32"] < tracker.metrics[f"{level}_mae_mean_16"]
    assert "universe_mae_ratio_16" in tracker.metrics
    assert tracker.artifacts == ["sample_size_study/s.tsv", "sample_size_study/s.png"]
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_cli_study_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["sample-size-study", "--eval", "16", "--tsv", "t", "--plot", "p"]
    assert cli.main(args) == 2
    assert "--eval '16': expected SIZE=EVAL_DIR" in capsys.readouterr().err
    missing = tmp_path / "nothing"
    args = ["sample-size-study", "--eval", f"16={missing}", "--tsv", "t", "--plot", "p"]
    assert cli.main([*args, "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml: config file not found" in capsys.readouterr().err
