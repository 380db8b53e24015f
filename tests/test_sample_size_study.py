"""The study engine, through the sample-size study: points and their configs and shards, the
error table, the gather (TSV, plot, report section, MLflow artifacts) and CLI errors."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from study_tables import gather_study

from cosmocub import cli
from cosmocub.config import ConfigError, from_values, load_config
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.studies.accuracy import level_rows
from cosmocub.studies.engine import Point, plan, point_values
from cosmocub.studies.sample_size import STUDY, select_lr, size_config_values

NAMES = NAME_PAR  # ("Omega_m", "sigma_8", "N_spec", "H_0")


def test_every_size_keeps_the_base_runs_data_ranks_under_a_spatial_split() -> None:
    # The base: 2 ranks on one sample (1 data rank, a global batch of 8). A size the study gives
    # 1 spatial rank runs on 1 rank and one it gives 2 on 2: 1 data rank, batch 8 at every size
    # (counting the base's 2 ranks as data ranks made them 2 and 4 ranks, batches of 16).
    cfg = load_config(None, {"parallel": {"spatial": 2}, "train": {"ranks_per_node": 2}})
    assert (cfg.data_ranks, cfg.global_batch) == (1, 8)
    for size, ranks in ((16, 1), (64, 2)):
        derived = from_values(size_config_values(cfg, size, 0.001))
        assert derived.train.ranks_per_node == derived.world_size == ranks
        assert (derived.data_ranks, derived.global_batch) == (1, 8)


def test_size_configs_change_the_sample_split_budget_and_lr() -> None:
    cfg = load_config(None)  # sizes [16, 32, 64], spatial [1, 1, 2] on 64³ universes
    values = size_config_values(cfg, 64, 0.001)
    derived = from_values(values)
    assert derived.preprocess.sample_size == derived.model.input_size == 64
    assert derived.parallel.split_dhw == (2, 1, 1) and derived.train.ranks_per_node == 2
    assert derived.train.run_name == "sample_size_64_lr0.001"
    assert derived.optimizer.lr == 0.001 and derived.optimizer.name == cfg.optimizer.name
    # The base schedule (warm-up 1, decays at 24 and 32 of 36 epochs) stretched to the study's
    # 150 epochs: warm-up 4, decays at 100 and 133, the same fractions of the run.
    assert cfg.train.epochs == 36 and cfg.sample_size_study.epochs == 150
    assert derived.optimizer.warmup_epochs == 4
    assert derived.optimizer.decay_epochs == (100, 133)
    assert derived.optimizer.decay_factors == cfg.optimizer.decay_factors
    assert derived.universes == cfg.universes and derived.seed == cfg.seed
    study = cfg.sample_size_study
    assert (derived.train.epochs, derived.train.max_steps_per_epoch) == (
        study.epochs,
        study.max_steps_per_epoch,
    )
    assert from_values(size_config_values(cfg, 16, 0.003)).parallel.spatial == 1
    names = [p.name for p in STUDY.points(cfg)]
    assert names[:3] == ["16_lr0.0001", "16_lr0.0003", "16_lr0.001"]
    # 64³ tries the grid × 0.125: the first dense layer's fan-in is 8× that at 32³.
    assert names[-3:] == ["64_lr1.25e-05", "64_lr3.75e-05", "64_lr0.000125"]
    with pytest.raises(ConfigError, match=r"'sample_size_study.sizes': 8 is not one of"):
        size_config_values(cfg, 8, 0.001)
    odd = load_config(
        None,
        overrides={
            "sample_size_study": {"sizes": [16, 24], "spatial": [1, 1], "lr_scales": [1, 1]}
        },
    )
    with pytest.raises(ConfigError, match=r"24 does not divide universes.size 64"):
        size_config_values(odd, 24, 0.001)
    with pytest.raises(ConfigError, match=r"'sample_size_study.spatial': 1 values for 2 sizes"):
        load_config(None, overrides={"sample_size_study": {"sizes": [16, 32], "spatial": [1]}})
    with pytest.raises(ConfigError, match=r"'sample_size_study.lr_scales': 3 values for 2 sizes"):
        load_config(None, overrides={"sample_size_study": {"sizes": [16, 32], "spatial": [1, 1]}})
    with pytest.raises(ConfigError, match=r"'sample_size_study.lrs': \[0.001, 0.001\] repeats"):
        load_config(None, overrides={"sample_size_study": {"lrs": [0.001, 0.001]}})


def fake_metrics(cnn: float, *, pk: float = 0.2, gaussian: bool = False) -> dict:
    """eval/metrics.json's comparison (and calibration) blocks: per parameter j, the CNN's MAE
    is cnn·(j+1), predict-the-mean's 0.5, the P(k) fit's pk; per crop everything doubled."""

    def table(scale: float) -> dict:
        out = {}
        for j, name in enumerate(NAMES):
            row = {"cnn": scale * cnn * (j + 1), "mean": scale * 0.5, "pk": scale * pk}
            row |= {"one_point": scale * 0.4}
            row |= {f"cnn_over_{e}": row["cnn"] / row[e] for e in ("mean", "one_point", "pk")}
            out[name] = row
        return out

    metrics = {
        "comparison": {
            "per_universe": table(1.0),
            "per_crop": table(2.0),
            "num_universes": 7,
            "num_crops": 56,
        }
    }
    metrics["comparison"]["per_universe"]["Omega_m"] |= {
        "cnn_over_pk_lo": 0.1,
        "cnn_over_pk_hi": 0.9,
    }
    if gaussian:
        width = {scope: {n: 0.1 * (j + 1) for j, n in enumerate(NAMES)} for scope in ("u", "c")}
        metrics["calibration"] = {
            "per_universe": {"after": {"width68": width["u"]}},
            "per_crop": {"after": {"width68": {n: 2 * w for n, w in width["c"].items()}}},
        }
    return metrics


def test_level_rows_read_the_comparison_per_universe_and_per_crop() -> None:
    rows = level_rows(fake_metrics(0.05, gaussian=True))
    table = {(r["level"], r["parameter"]): r for r in rows}
    assert len(rows) == 2 * 5 and rows[0]["level"] == "universe"
    u = table["universe", "sigma_8"]
    assert (u["count"], table["sample", "sigma_8"]["count"]) == (7, 56)
    assert u["cnn_mae"] == pytest.approx(0.1) and u["pk_mae"] == pytest.approx(0.2)
    assert u["cnn_over_mean"] == pytest.approx(0.2) and u["cnn_over_pk"] == pytest.approx(0.5)
    assert table["sample", "sigma_8"]["cnn_mae"] == pytest.approx(0.2)
    assert table["universe", "Omega_m"]["cnn_over_pk_lo"] == 0.1
    assert math.isnan(u["cnn_over_pk_lo"])
    # Widths: 0.1·(j+1) per universe, doubled per crop; the mean row averages them.
    assert u["width68"] == pytest.approx(0.2) and table["sample", "H_0"][
        "width68"
    ] == pytest.approx(0.8)
    mean = table["universe", "mean"]
    assert mean["cnn_mae"] == pytest.approx(0.05 * 2.5) and mean["width68"] == pytest.approx(0.25)
    assert mean["cnn_over_pk"] == pytest.approx(0.05 * 2.5 / 0.2)
    assert mean["cnn_over_mean"] == pytest.approx(0.05 * 2.5 / 0.5)
    # The point head has no calibration block: no widths.
    assert all(math.isnan(r["width68"]) for r in level_rows(fake_metrics(0.05)))


def test_select_lr_keeps_the_lowest_val_loss_per_size_and_checks_budgets() -> None:
    cfg = load_config(None, overrides={"sample_size_study": {"lrs": [0.001, 0.002, 0.004]}})
    losses = {
        (16, 0.001): 0.9,
        (16, 0.002): 0.7,
        (16, 0.004): float("nan"),
        (32, 0.001): 0.5,
        (32, 0.002): 0.6,
        (32, 0.004): 0.55,
    }
    rows = [
        {
            "point": f"{s}_lr{lr:g}",
            "sample_size": s,
            "lr": lr,
            "steps": 48,
            "final_val_loss": v,
            "level": level,
        }
        for (s, lr), v in losses.items()
        for level in ("universe", "sample")
    ]
    out = select_lr([dict(r) for r in rows], cfg)
    chosen = {(r["sample_size"], r["lr"]) for r in out if r["selected"] == 1}
    assert chosen == {(16, 0.002), (32, 0.001)}
    assert sum(r["selected"] for r in out) == 4  # two levels of each chosen point
    assert {r["lr_grid"] for r in out} == {"0.001 0.002 0.004"}
    rows[0] = rows[0] | {"steps": 40}
    with pytest.raises(ValueError, match=r"unequal budgets.*'16_lr0.001': 40.*'16_lr0.002': 48"):
        select_lr(rows, cfg)


def test_select_lr_chooses_by_the_per_universe_validation_mae_not_the_loss() -> None:
    cfg = load_config(None, overrides={"sample_size_study": {"lrs": [0.001, 0.002]}})
    # At 16 the loss prefers 0.001 and the MAE 0.002: the MAE wins. At 32 a point was
    # evaluated before metrics.json held the MAE: that size falls back to the loss, and says so.
    scores = {
        (16, 0.001): (0.5, 0.30),
        (16, 0.002): (0.6, 0.25),
        (32, 0.001): (0.5, None),
        (32, 0.002): (0.4, 0.20),
    }
    rows = [
        {
            "point": f"{s}_lr{lr:g}",
            "sample_size": s,
            "lr": lr,
            "steps": 48,
            "final_val_loss": loss,
            "val_universe_mae": mae,
            "level": "universe",
        }
        for (s, lr), (loss, mae) in scores.items()
    ]
    out = select_lr(rows, cfg)
    chosen = {(r["sample_size"], r["lr"], r["selected_by"]) for r in out if r["selected"] == 1}
    assert chosen == {(16, 0.002, "val_universe_mae"), (32, 0.002, "final_val_loss")}


class RecordingTracker:
    def __init__(self) -> None:
        self.artifacts: list[str] = []

    def log_artifact(self, path, artifact_path=None) -> None:
        self.artifacts.append(f"{artifact_path}/{Path(path).name}")


def write_point(folder: Path, metrics: dict, *, steps: int, val_loss: float) -> None:
    """What study_point and study_evaluate leave in a point's folder."""
    (folder / "eval").mkdir(parents=True)
    (folder / "run").mkdir()
    (folder / "eval/metrics.json").write_text(json.dumps(metrics))
    summary = {"mlflow_run_id": None, "steps": steps}
    (folder / "run/train_summary.json").write_text(json.dumps(summary))
    epochs = [{"step": steps // 2, "val_loss": 9.0}, {"step": steps, "val_loss": val_loss}]
    (folder / "run/metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))


def test_gather_writes_tsv_plot_and_report_section(tmp_path: Path) -> None:
    overrides = {"sizes": [16, 32], "spatial": [1, 2], "lrs": [0.001, 0.003], "lr_scales": [1, 1]}
    cfg = load_config(None, overrides={"sample_size_study": overrides})
    # At 16 the larger lr validates better, at 32 the smaller; less error at 32.
    points = {
        "16_lr0.001": (fake_metrics(0.3, gaussian=True), 1.2),
        "16_lr0.003": (fake_metrics(0.2, gaussian=True), 1.0),
        "32_lr0.001": (fake_metrics(0.1, pk=0.15, gaussian=True), 0.4),
        "32_lr0.003": (fake_metrics(0.4, pk=0.15, gaussian=True), 0.8),
    }
    for name, (metrics, loss) in points.items():
        write_point(tmp_path / name, metrics, steps=24, val_loss=loss)
    tracker = RecordingTracker()
    out = {
        "tsv": tmp_path / "points.tsv",
        "png": tmp_path / "sample_size.png",
        "md": tmp_path / "summary.md",
    }
    rows = gather_study(cfg, "sample_size", tmp_path, tracker=tracker)
    with open(out["tsv"]) as f:
        on_disk = list(csv.DictReader(f, delimiter="\t"))
    assert len(on_disk) == len(rows) == 4 * 2 * 5
    picked = {(r["point"], r["level"], r["parameter"]): r for r in on_disk if r["selected"] == "1"}
    assert {p for p, _, _ in picked} == {"16_lr0.003", "32_lr0.001"}
    u16, u32 = picked["16_lr0.003", "universe", "mean"], picked["32_lr0.001", "universe", "mean"]
    assert (u16["spatial"], u32["spatial"], u32["steps"], u32["lr"]) == ("1", "2", "24", "0.001")
    assert u16["lr_grid"] == "0.001 0.003" and float(u32["final_val_loss"]) == 0.4
    assert float(u16["cnn_over_pk"]) == pytest.approx(0.2 * 2.5 / 0.2)
    assert float(u32["cnn_over_pk"]) == pytest.approx(0.1 * 2.5 / 0.15, rel=1e-5)
    assert float(u32["pk_mae"]) == pytest.approx(0.15)
    assert float(u32["width68"]) == pytest.approx(0.25)
    metrics = {p: STUDY.point_metrics([r for r in rows if r["point"] == p]) for p in points}
    assert metrics["16_lr0.001"].keys() == metrics["32_lr0.001"].keys()
    assert metrics["32_lr0.001"]["univ_cnn_over_mean_N_spec"] == pytest.approx(0.3 / 0.5)
    names = ("points.tsv", "sample_size.png", "summary.md")
    assert tracker.artifacts == [f"sample_size_study/{name}" for name in names]
    assert out["png"].stat().st_size > 10_000
    section = out["md"].read_text()
    assert (
        section.startswith("## Study `sample_size`")
        and "![Study `sample_size`](sample_size.png)" in section
    )
    assert (
        section.count("\n| 32_lr0.001 | 32 | 0.001 | 0.001 0.003 | 1 | final_val_loss | 2 | 24 |")
        == 10
    )


def test_points_share_shards_and_may_not_touch_fixed_sections() -> None:
    cfg = load_config(None)  # sizes [16, 32, 64]; the base run's crops are 32³
    planned = {p.point.name: p for p in plan(cfg, "sample_size")}
    assert planned["32_lr0.001"].shards == str(cfg.results / "shards")  # the base run's own
    assert planned["16_lr0.001"].shards.endswith(planned["16_lr0.001"].shard_key)
    # The lr grid shares the size's shards.
    assert planned["16_lr0.001"].shards == planned["16_lr0.0003"].shards
    assert planned["16_lr0.001"].shard_key != planned["64_lr0.000125"].shard_key
    assert (planned["16_lr0.001"].ranks, planned["64_lr3.75e-05"].ranks) == (1, 2)
    with pytest.raises(ConfigError, match=r"overrides \['universes'\], which every point shares"):
        Point(name="x", overrides={"universes": {"count": 2}})
    with pytest.raises(
        ConfigError, match=r"study sample_size point 16: key 'model': .*'bad' was unexpected"
    ):
        point_values(cfg, "sample_size", Point(name="16", overrides={"model": {"bad": 1}}))


def test_cli_study_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["study-gather", "--study", "nope", "--dir", str(tmp_path)]) == 2
    known = "known_answer, network, sample_size, scaling, step_time, universes"
    assert f"study 'nope': unknown ({known})" in capsys.readouterr().err
    args = ["study-point-config", "--study", "sample_size", "--point", "7", "--out", "o.yaml"]
    assert cli.main(args) == 2
    assert "study 'sample_size': no point '7' (points: 16_lr0.0001, 16_lr0.0003," in (
        capsys.readouterr().err
    )
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
    # What the step waited for (exposed) is exchange_s; how long the exchange ran is blank for a
    # run from before it was recorded, and its own mean where it was.
    assert row["exchange_exposed_s"] == row["exchange_s"] and row["exchange_busy_s"] is None
    for e, busy in zip(epochs, (9.0, 0.25, 1.0), strict=True):
        e["time_exchange_busy_s"] = busy
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    row = training_row(PointOutputs(point=Point(name="p", overrides={}), folder=tmp_path))
    assert row["exchange_busy_s"] == pytest.approx((4 * 0.25 + 2 * 1.0) / 6)
