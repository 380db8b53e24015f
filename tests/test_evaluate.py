"""Evaluation: metric functions on hand-computed predictions, and evaluate() end to end on a tiny
shard folder and model file written here."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from cosmocub.config import ModelConfig, load_config
from cosmocub.data.features import FEATURES_FILE, write_features
from cosmocub.evaluation.evaluate_run import evaluate
from cosmocub.evaluation.headline import comparison_table
from cosmocub.evaluation.metrics import (
    parameter_metrics,
    regression_metrics,
    to_physical,
    tracker_metrics,
)
from cosmocub.evaluation.report import format_run
from cosmocub.io import read_jsonl
from cosmocub.models import cosmoflow, model_factory

NAMES = ("Omega_m", "sigma_8", "N_spec", "H_0")


# ---------------------------------------------------------------------------------------------
# Pure metrics


def test_regression_metrics_hand_computed():
    m = regression_metrics(np.array([1.0, 2, 3, 4]), np.array([1.0, 2, 3, 5]))
    # errors (0, 0, 0, -1): MAE 1/4, RMSE sqrt(1/4); SS_tot about mean 2.75 = 8.75
    assert m["mae"] == pytest.approx(0.25)
    assert m["rmse"] == pytest.approx(0.5)
    assert m["r2"] == pytest.approx(1 - 1 / 8.75)


def test_regression_metrics_perfect_and_constant_truth():
    true = np.array([0.1, -0.3, 0.7])
    assert regression_metrics(true, true) == {"mae": 0.0, "rmse": 0.0, "r2": 1.0}
    m = regression_metrics(np.array([1.0, 2.0]), np.array([1.5, 1.5]))
    assert m["mae"] == pytest.approx(0.5)
    assert math.isnan(m["r2"])  # undefined, not a made-up number


def test_regression_metrics_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"pred \(3,\) and true \(2,\)"):
        regression_metrics(np.zeros(3), np.zeros(2))


TRUE = np.array([[0.2, -0.4, 0.6, 0.0], [0.4, 0.0, -0.6, 0.5]])
PRED = np.array([[0.1, -0.4, 0.5, 0.1], [0.5, 0.2, -0.6, 0.5]])
TRAIN_MEAN = np.array([0.3, 0.0, 0.0, 0.25])


def test_parameter_metrics_hand_computed():
    m = parameter_metrics(PRED, TRUE, TRAIN_MEAN)
    p = m["per_parameter"]
    assert list(p) == list(NAMES)
    # Omega_m: errors (-0.1, 0.1) → MAE 0.1, R² 0; train mean 0.3 is 0.1 from both → ratio 1.
    assert p["Omega_m"]["mae"] == pytest.approx(0.1)
    assert p["Omega_m"]["r2"] == pytest.approx(0.0, abs=1e-12)
    assert p["Omega_m"]["baseline_mae"] == pytest.approx(0.1)
    assert p["Omega_m"]["mae_ratio"] == pytest.approx(1.0)
    assert p["Omega_m"]["mae_phys"] == pytest.approx(0.1 * 0.3 * 0.1)
    # sigma_8: errors (0, 0.2) → MAE 0.1, RMSE sqrt(0.02), R² 1 - 0.04/0.08; baseline 0 → 0.2.
    assert p["sigma_8"]["rmse"] == pytest.approx(math.sqrt(0.02))
    assert p["sigma_8"]["r2"] == pytest.approx(0.5)
    assert p["sigma_8"]["mae_ratio"] == pytest.approx(0.5)
    assert p["sigma_8"]["mae_phys"] == pytest.approx(0.1 * 0.8 * 0.1)
    # The train mean (0) misses the test mean (-0.2): SS_res 0.16 vs SS_tot 0.08 → R² -1.
    assert p["sigma_8"]["baseline_r2"] == pytest.approx(-1.0)
    # N_spec: R² 1 - 0.01/0.72, baseline MAE 0.6.
    assert p["N_spec"]["r2"] == pytest.approx(1 - 0.01 / 0.72)
    assert p["N_spec"]["mae_ratio"] == pytest.approx(0.05 / 0.6)
    # H_0: MAE 0.05 in u is 0.1·70·0.05 = 0.35 km/s/Mpc; R² invariant under the linear map.
    assert p["H_0"]["mae_phys"] == pytest.approx(0.35)
    assert p["H_0"]["r2_phys"] == pytest.approx(p["H_0"]["r2"]) == pytest.approx(0.92)
    assert p["H_0"]["baseline_mae_phys"] == pytest.approx(0.1 * 70 * 0.25)
    assert m["mean"]["mae"] == pytest.approx(0.075)
    assert m["mean"]["baseline_mae"] == pytest.approx(0.2875)
    assert m["mean"]["mae_ratio"] == pytest.approx(0.075 / 0.2875)


def test_tracker_metrics_names_and_drops_nan():
    true = TRUE.copy()
    true[:, 3] = 0.5  # constant H_0 truth: R² undefined
    flat = tracker_metrics(parameter_metrics(PRED, true, TRAIN_MEAN))
    assert flat["test_mae_Omega_m"] == pytest.approx(0.1)
    assert flat["baseline_mae_sigma_8"] == pytest.approx(0.2)
    assert flat["test_r2_N_spec"] == pytest.approx(1 - 0.01 / 0.72)
    assert flat["test_mae"] == pytest.approx((0.1 + 0.1 + 0.05 + 0.2) / 4)
    assert "test_r2_H_0" not in flat


def test_to_physical_matches_cosmouniverse_bases():
    phys = to_physical(np.array([[0.0, 0.0, 0.0, 0.0], [-1.0, 0.5, 1.0, -0.5]]))
    np.testing.assert_allclose(phys[0], [0.3, 0.8, 0.96, 70.0])
    np.testing.assert_allclose(phys[1], [0.27, 0.84, 1.056, 66.5])


def test_read_jsonl_names_bad_line_and_missing_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1, "train_loss": 0.5}\n\n{"epoch": 2, oops}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not JSON"):
        read_jsonl(path)
    # One behaviour for a missing file (issue 20): an error naming it. `evaluate` checks for the
    # run's metrics.jsonl itself, and draws the loss figure without curves when it is absent.
    with pytest.raises(FileNotFoundError, match=r"absent\.jsonl: not found"):
        read_jsonl(tmp_path / "absent.jsonl")


# ---------------------------------------------------------------------------------------------
# evaluate() end to end

SIZE, CHANNELS = 8, 2


class RecordingTracker:
    run_id = "fake"

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.artifacts: list[tuple[str, str | None]] = []

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def log_artifact(self, path, artifact_path=None):
        assert Path(path).is_file(), path  # logged after the eval folder is in place
        self.artifacts.append((Path(path).name, artifact_path))


STATS_MEAN, STATS_STD = [2.0, 1.5], [1.4, 0.9]  # the tiny run's stats.json


def _tiny_model_cfg() -> ModelConfig:
    return ModelConfig(
        input_size=SIZE,
        in_channels=CHANNELS,
        base_filters=2,
        num_conv_blocks=1,
        kernel_size=3,
        dense_sizes=(4,),
        num_outputs=4,
        dropout=0.0,
        batch_norm=False,
        leaky_relu_slope=0.3,
        output_scale=1.2,
        head="point",
        nll_beta=0.5,
    )


def _write_shard(path: Path, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.gamma(2.0, 1.0, size=(n, CHANNELS, SIZE, SIZE, SIZE)).astype(np.float16)
    y = rng.uniform(-1, 1, size=(n, 4)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(1, CHANNELS, 4, SIZE, SIZE))
        f.create_dataset("y", data=y)
        f.create_dataset("universe_index", data=np.arange(n, dtype=np.int32) // 2)
        f.create_dataset("crop_origin", data=np.zeros((n, 3), dtype=np.int32))
        f.attrs["log1p"] = True
    return x, y


@pytest.fixture
def tiny_run(tmp_path):
    rng = np.random.default_rng(3)
    shards, run_dir = tmp_path / "shards", tmp_path / "run"
    shards.mkdir()
    run_dir.mkdir()
    _, y_train = _write_shard(shards / "train.h5", rng, 6)
    x_test, y_test = _write_shard(shards / "test.h5", rng, 5)
    _write_shard(shards / "val.h5", rng, 4)
    write_features(shards, shards / FEATURES_FILE, num_workers=1)
    mean, std = STATS_MEAN, STATS_STD
    (shards / "stats.json").write_text(json.dumps({"mean": mean, "std": std, "split": "train"}))
    torch.manual_seed(0)
    model = cosmoflow.CosmoFlow(_tiny_model_cfg())
    model_factory.save_model_file(run_dir / "model.pt", model, _tiny_model_cfg())
    records = [
        {"epoch": e, "step": 3 * e, "train_loss": 0.4 / e, "val_loss": 0.5 / e, "val_mae": 0.3 / e}
        | {f"val_mae_{n}": 0.2 / e for n in NAMES}
        for e in (1, 2, 3)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = load_config(
        None,
        overrides={
            "results": str(tmp_path / "results"),
            "universes": {"size": 16},
            "preprocess": {"sample_size": SIZE, "slab_depth": 4},
            "model": {"input_size": SIZE, "num_conv_blocks": 1},
            # 5 samples: a ragged last batch; no test-time symmetries (the default 8 averages)
            "evaluate": {"batch_size": 2, "symmetries": 1},
        },
    )
    # Expected predictions computed independently: standardise with stats.json by hand.
    x_std = (x_test.astype(np.float32) - np.reshape(mean, (1, -1, 1, 1, 1))) / np.reshape(
        std, (1, -1, 1, 1, 1)
    )
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(x_std.astype(np.float32))).numpy()
    return cfg, shards, run_dir, tmp_path / "run" / "eval", expected, y_test, y_train


def test_evaluate_gaussian_head_writes_calibration(tiny_run):
    cfg, shards, run_dir, out_dir, *_ = tiny_run
    model_cfg = dataclasses.replace(_tiny_model_cfg(), head="gaussian")
    torch.manual_seed(1)
    model_factory.save_model_file(run_dir / "model.pt", cosmoflow.CosmoFlow(model_cfg), model_cfg)
    tracker = RecordingTracker()
    metrics = evaluate(cfg, shards_dir=shards, run_dir=run_dir, out_dir=out_dir, tracker=tracker)
    assert (out_dir / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ("calibration.png", "eval") in tracker.artifacts
    calibration = metrics["calibration"]
    with np.load(out_dir / "predictions.npz") as npz:
        mean_u, var_u = npz["universe_cnn_unit"], npz["universe_var_unit"]
        true_u = npz["universe_true_unit"]
    for j, name in enumerate(NAMES):
        inside = np.abs(mean_u[:, j] - true_u[:, j]) <= 0.9945 * np.sqrt(var_u[:, j])
        got = calibration["per_universe"]["after"]["coverage"][name]["0.68"]
        assert got == pytest.approx(inside.mean())
        assert tracker.metrics[f"coverage68_univ_after_{name}"] == pytest.approx(got)
    assert len(calibration["per_crop"]["before"]["curve"][0]) == len(calibration["curve_levels"])
    held_out = calibration["validation_held_out"]
    assert held_out["folds"] == min(5, held_out["num_universes"])
    for name in NAMES:
        assert 0 <= held_out["coverage"][name]["0.68"] <= held_out["coverage"][name]["0.95"] <= 1
        assert tracker.metrics[f"coverage68_univ_val_held_out_{name}"] == pytest.approx(
            held_out["coverage"][name]["0.68"]
        )
        # The test universes' errors ÷ their calibrated σ, from the files written.
        z = (mean_u[:, NAMES.index(name)] - true_u[:, NAMES.index(name)]) / np.sqrt(
            var_u[:, NAMES.index(name)]
        )
        assert held_out["error_rms"]["test"][name] == pytest.approx(np.sqrt(np.mean(z**2)))
    # The report's front page leads with CNN ÷ best classical per universe (with its bootstrap
    # range), then the coverage table.
    # How the step was fed, from the training summary's last epoch.
    final = {"samples_per_s": 812.5, "data_wait_share": 0.021, "device_busy_share": 0.934}
    summary = {"steps": 3, "final": final, "data_placement": "device"}
    (run_dir / "train_summary.json").write_text(json.dumps(summary))
    page = "\n".join(format_run(out_dir / "metrics.json"))
    assert "data wait 2.1 %, device busy 93.4 %, batches cut by device" in page
    row = metrics["comparison"]["per_universe"]["sigma_8"]
    lead = f"**{row['cnn_over_classical']:.3f} ({row['cnn_over_classical_lo']:.2f}–"
    assert "| sigma_8 | " in page and lead in page
    assert "CNN ÷ best classical" in page
    assert "| held-out 68 % | held-out 95 % | error ÷ σ, validation | error ÷ σ, test |" in page
    assert page.index("per universe") < page.index("per crop") < page.index("Coverage")


def test_evaluate_end_to_end(tiny_run):
    cfg, shards, run_dir, out_dir, expected, y_test, y_train = tiny_run
    tracker = RecordingTracker()
    metrics = evaluate(cfg, shards_dir=shards, run_dir=run_dir, out_dir=out_dir, tracker=tracker)

    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        [
            "metrics.json",
            "predictions.npz",
            "pred_vs_true.png",
            "loss_curves.png",
            "calibration.png",
        ]
    )
    with np.load(out_dir / "predictions.npz") as npz:
        np.testing.assert_allclose(npz["pred_unit"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(npz["true_unit"], y_test)
        np.testing.assert_allclose(npz["true_phys"], to_physical(y_test), rtol=1e-6)
        np.testing.assert_array_equal(npz["universe_index"], [0, 0, 1, 1, 2])
    saved = json.loads((out_dir / "metrics.json").read_text())
    assert saved["num_samples"] == 5
    np.testing.assert_allclose(saved["train_mean_unit"], y_train.mean(axis=0), rtol=1e-6)
    for j, name in enumerate(NAMES):
        ref = regression_metrics(expected[:, j], y_test[:, j])
        base = regression_metrics(np.full(5, y_train[:, j].mean()), y_test[:, j])
        got = saved["per_parameter"][name]
        assert got["mae"] == pytest.approx(ref["mae"], rel=1e-5)
        assert got["r2"] == pytest.approx(ref["r2"], rel=1e-4)
        assert got["baseline_mae"] == pytest.approx(base["mae"], rel=1e-6)
        assert got["mae_ratio"] == pytest.approx(ref["mae"] / base["mae"], rel=1e-5)
        assert tracker.metrics[f"test_mae_{name}"] == pytest.approx(ref["mae"], rel=1e-5)
    assert metrics["mean"]["mae"] == pytest.approx(saved["mean"]["mae"])
    # Per universe (crops 0-1, 2-3, 4): the mean of a universe's crops against the baselines.
    groups = [[0, 1], [2, 3], [4]]
    pred_u = np.stack([expected[g].mean(0) for g in groups])
    true_u = np.stack([y_test[g].mean(0) for g in groups])
    with np.load(out_dir / "predictions.npz") as npz:
        pk_u = npz["universe_pk_unit"]
        np.testing.assert_allclose(npz["universe_cnn_unit"], pred_u, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(npz["universes"], [0, 1, 2])
    per_universe = saved["comparison"]["per_universe"]
    for j, name in enumerate(NAMES):
        cnn = np.abs(pred_u[:, j] - true_u[:, j]).mean()
        pk = np.abs(pk_u[:, j] - true_u[:, j]).mean()
        row = per_universe[name]
        assert row["cnn"] == pytest.approx(cnn, rel=1e-5)
        assert row["mean"] == pytest.approx(np.abs(y_train[:, j].mean() - true_u[:, j]).mean())
        assert row["cnn_over_pk"] == pytest.approx(cnn / pk, rel=1e-5)
        assert tracker.metrics[f"univ_cnn_over_pk_{name}"] == pytest.approx(cnn / pk, rel=1e-5)
        assert saved["comparison"]["per_crop"][name]["cnn"] == pytest.approx(
            saved["per_parameter"][name]["mae"]
        )
    assert "calibration" not in saved  # the point head has no intervals
    # Validation per universe (crops 0-1, 2-3), as the test's: what a study picks its lr by.
    with h5py.File(shards / "val.h5", "r") as f:
        x_val, y_val = f["x"][:], f["y"][:]
    x_val = (x_val.astype(np.float32) - np.reshape(STATS_MEAN, (1, -1, 1, 1, 1))) / np.reshape(
        STATS_STD, (1, -1, 1, 1, 1)
    )
    model = model_factory.load_model_file(run_dir / "model.pt").eval()
    with torch.no_grad():
        pred_val = model(torch.from_numpy(x_val.astype(np.float32))).numpy()
    val_u = [np.abs(pred_val[g].mean(0) - y_val[g].mean(0)) for g in ([0, 1], [2, 3])]
    val_mae = np.mean(val_u, axis=0)
    validation = saved["validation"]
    assert validation["num_universes"] == 2
    for j, name in enumerate(NAMES):
        assert validation["per_universe_mae"][name] == pytest.approx(val_mae[j], rel=1e-5)
    assert validation["mean_per_universe_mae"] == pytest.approx(val_mae.mean(), rel=1e-5)
    for choice in saved["comparison"]["classical_choice"].values():
        assert choice["features"] == {"pk": ["pk"], "one_point": ["one_point"]}.get(
            choice["feature_set"], ["pk", "log_pk", "one_point"]
        )
    assert list(saved["comparison"]["classical_choice"]) == list(NAMES)
    assert {a for a, _ in tracker.artifacts} == {p.name for p in out_dir.iterdir()}
    assert all(where == "eval" for _, where in tracker.artifacts)
    # PNGs are real images of a sensible size, not empty files.
    for png in ("pred_vs_true.png", "loss_curves.png"):
        head = (out_dir / png).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width = int.from_bytes(head[16:20], "big")
        assert width > 400


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("run/model.pt", r"run/model.pt: trained model not found"),
        ("shards/test.h5", r"shards/test.h5: shard not found"),
    ],
)
def test_evaluate_missing_input_names_path(tiny_run, remove, message):
    cfg, shards, run_dir, out_dir, *_ = tiny_run
    (run_dir.parent / remove).unlink()
    with pytest.raises(FileNotFoundError, match=message):
        evaluate(cfg, shards_dir=shards, run_dir=run_dir, out_dir=out_dir, tracker=None)
    assert not out_dir.exists()


class _CornerModel(torch.nn.Module):
    """Predicts the first channel's voxel at (0, 0, 0): as orientation-dependent as it gets."""

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        return x_bcdhw[:, 0, 0, 0, 0].unsqueeze(1).repeat(1, 4)


def test_predict_averages_over_the_reflections_of_the_cube():
    from cosmocub.evaluation.split_predictions import predict

    x = torch.randn(3, 2, 4, 4, 4)
    dataset = [(x[i], torch.zeros(4)) for i in range(3)]
    pred_1, _ = predict(_CornerModel(), dataset, batch_size=2, symmetries=1)
    pred_8, _ = predict(_CornerModel(), dataset, batch_size=2, symmetries=8)
    corners = x[:, 0][:, [0, -1]][:, :, [0, -1]][:, :, :, [0, -1]]  # (3, 2, 2, 2)
    np.testing.assert_allclose(pred_1[:, 0], x[:, 0, 0, 0, 0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(pred_8[:, 0], corners.mean(dim=(1, 2, 3)).numpy(), rtol=1e-5)


def test_comparison_table_ratios_and_bootstrap_range():
    true = np.zeros((4, 1))
    preds = {
        "cnn": np.array([[0.1], [0.1], [0.3], [0.3]]),
        "mean": np.full((4, 1), 0.8),
        "one_point": np.full((4, 1), 0.4),
        "pk": np.full((4, 1), 0.4),
    }
    row = comparison_table(preds, true, ["p"], bootstrap=500)["p"]
    assert row["cnn"] == pytest.approx(0.2) and row["cnn_over_mean"] == pytest.approx(0.25)
    assert row["cnn_over_pk"] == pytest.approx(0.5)
    # Resampling four universes: the ratio's ±1σ range spans values between 0.25 and 0.75.
    assert 0.25 <= row["cnn_over_pk_lo"] < 0.5 < row["cnn_over_pk_hi"] <= 0.75


def test_evaluate_names_known_answer_parameters_by_their_universes(tiny_run):
    from cosmocub.data.known_answer_fields import DESIGN, PARAMETERS

    cfg, shards, run_dir, out_dir, _, y_test, _ = tiny_run
    cfg = dataclasses.replace(
        cfg, universes=dataclasses.replace(cfg.universes, source="known_answer")
    )
    tracker = RecordingTracker()
    metrics = evaluate(cfg, shards_dir=shards, run_dir=run_dir, out_dir=out_dir, tracker=tracker)
    assert list(metrics["per_parameter"]) == list(PARAMETERS) == metrics["params"]
    assert list(metrics["comparison"]["per_universe"]) == list(PARAMETERS)
    assert "univ_cnn_over_pk_f_nl" in tracker.metrics
    # Physical units are the known-answer design's: f_nl = 0.5·u, its MAE half the unitPar one.
    f_nl = metrics["per_parameter"]["f_nl"]
    assert f_nl["mae_phys"] == pytest.approx(0.5 * f_nl["mae"])
    with np.load(out_dir / "predictions.npz") as npz:
        np.testing.assert_allclose(npz["true_phys"], DESIGN.physical(y_test), rtol=1e-6)
        assert list(npz["param_names"]) == list(PARAMETERS)
