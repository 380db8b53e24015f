"""The network and scaling studies' own arithmetic (time to target, speedup beside the reference's
exchange share, efficiency per core-second), the scaling study's cores per rank (the same for
every point; oversubscribed meshes marked, without efficiency) and a study whose emulated points
were skipped."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
from study_outputs import point_times, write_scaling_outputs
from study_tables import gather_study

from cosmocub.config import load_config
from cosmocub.launch.resources import study_cpus_per_rank
from cosmocub.netemu.runner import NodesRunResult, split_cores
from cosmocub.studies import network, scaling
from cosmocub.studies.engine import plan, point_record, write_point_record
from cosmocub.studies.runners import PointSkipped, run_emulated

REPO = Path(__file__).resolve().parents[1]


def test_time_to_target_is_the_first_validation_at_or_below_it() -> None:
    curve = [(1.0, 0.9), (2.0, 0.5), (3.0, 0.6), (4.0, 0.4)]
    assert network.time_to(curve, 0.5) == 2.0
    assert network.time_to(curve, 0.45) == 4.0
    assert network.time_to(curve, 0.3) is None


def test_smoothed_curve_is_a_trailing_mean_from_the_kth_evaluation() -> None:
    curve = [(1.0, 0.9), (2.0, 0.6), (3.0, 0.3), (4.0, 0.6)]
    assert network.smoothed(curve, 1) == curve
    out = network.smoothed(curve, 3)
    assert [t for t, _ in out] == [3.0, 4.0]
    assert [loss for _, loss in out] == [pytest.approx(0.6), pytest.approx(0.5)]
    assert network.smoothed(curve[:2], 3) == []


def _row(variant, mbit, step, exchange, curve, final, seed=None):
    return {
        "variant": variant,
        "rate_mbit": mbit,
        "seed": seed,
        "step_s": step,
        "exchange_s": exchange,
        "momentum_sync_s": 0.0,
        "final_val_loss": final,
        "_curve": curve,
    }


def _with_smoothing(k: int):
    cfg = load_config(REPO / "config" / "config.yaml")  # reference lion, rates include 0
    study = dataclasses.replace(cfg.network_study, target_smoothing=k)
    return dataclasses.replace(cfg, network_study=study)


def test_speedup_and_exchange_share_against_the_reference_at_each_rate() -> None:
    cfg = _with_smoothing(1)  # raw losses: the reference's final loss is the target
    rows = [
        _row("lion", 0, 0.1, 0.02, [(5.0, 0.8), (10.0, 0.5)], 0.5),
        _row("lion", 10, 0.5, 0.45, [(20.0, 0.9), (40.0, 0.55), (60.0, 0.5)], 0.5),
        _row("cub", 0, 0.12, 0.01, [(6.0, 0.7), (12.0, 0.49)], 0.49),
        _row("cub", 10, 0.15, 0.05, [(8.0, 0.6), (15.0, 0.52)], 0.52),
        {"variant": "adamw", "rate_mbit": 10, "skipped": "no CAP_NET_ADMIN"},
    ]
    out = {(r["variant"], r["rate_mbit"]): r for r in network.finish(rows, cfg)}
    assert all(r.get("target_val_loss") == 0.5 for r in rows if not r.get("skipped"))
    assert out["lion", 10]["time_to_target_s"] == 60.0
    assert out["cub", 0]["time_to_target_s"] == 12.0
    assert out["cub", 10]["time_to_target_s"] is None  # never reached 0.5
    assert out["cub", 0]["speedup_vs_reference"] == pytest.approx(10.0 / 12.0)
    assert "speedup_vs_reference" not in out["cub", 10]
    assert out["cub", 10]["reference_exchange_share"] == pytest.approx(0.9)
    assert out["lion", 0]["reference_exchange_share"] == pytest.approx(0.2)
    assert "time_to_target_s" not in out["adamw", 10]


def test_each_seed_is_held_to_the_references_run_of_its_seed_and_summed_up_over_seeds() -> None:
    cfg = _with_smoothing(1)  # config.yaml: seeds [0, 1, 2]
    rows = [
        _row("lion", 0, 0.1, 0.02, [(5.0, 0.8), (10.0, 0.5)], 0.5, seed=0),
        _row("lion", 0, 0.1, 0.02, [(5.0, 0.7), (10.0, 0.6)], 0.6, seed=1),
        _row("cub", 0, 0.05, 0.01, [(4.0, 0.5), (8.0, 0.45)], 0.45, seed=0),
        _row("cub", 0, 0.08, 0.01, [(4.0, 0.65), (8.0, 0.55)], 0.55, seed=1),
        _row("cub", 0, 0.08, 0.01, [(4.0, 0.65), (8.0, 0.7)], 0.7, seed=2),  # no lion of seed 2
    ]
    out = {(r["variant"], r["seed"]): r for r in network.finish(rows, cfg)}
    assert out["cub", 0]["target_val_loss"] == 0.5 and out["cub", 1]["target_val_loss"] == 0.6
    assert out["cub", 0]["speedup_vs_reference"] == pytest.approx(10.0 / 4.0)
    assert out["cub", 1]["speedup_vs_reference"] == pytest.approx(10.0 / 8.0)
    assert out["cub", 1]["step_speedup_vs_reference"] == pytest.approx(0.1 / 0.08)
    assert out["cub", 2]["target_val_loss"] is None and "speedup_vs_reference" not in out["cub", 2]
    (lion, cub) = network.over_seeds(rows)
    assert (cub["variant"], cub["seeds"], cub["met_target"]) == ("cub", 3, 2)
    assert cub["speedup_vs_reference"] == pytest.approx(1.875)  # median of the two that met it
    assert (cub["speedup_vs_reference_min"], cub["speedup_vs_reference_max"]) == (1.25, 2.5)
    assert cub["final_val_loss_smoothed"] == 0.55 and lion["time_to_target_s"] == 10.0
    section = network.over_seeds_section(rows, cfg)
    assert (
        "| cub | 0 | 3 | 2 | 0.08 [0.05, 0.08] | 1.62 [1.25, 2] | 6 [4, 8] | 1.88 [1.25, 2.5] |"
        in section
    )
    assert network.over_seeds_section(rows, load_config(REPO / "config" / "test.yaml")) == ""


def test_the_default_study_trains_every_variant_and_rate_once_per_seed_on_the_same_shards() -> None:
    from cosmocub.studies.engine import point_config

    cfg = load_config(REPO / "config" / "config.yaml")
    study = cfg.network_study
    points = network.points(cfg)
    assert len(points) == len(study.variants) * len(study.rates_mbit) * len(study.seeds)
    by_name = {p.name: p for p in points}
    point = by_name["lion_cub_1bit_node_10mbit_seed2"]
    assert point.labels == {"variant": "lion_cub_1bit_node", "rate_mbit": 10, "seed": 2}
    assert (point.launch.nodes, point.launch.ranks_per_node) == (2, 2)
    trained = point_config(cfg, "network", point)
    assert trained.training_seed == 2 and trained.seed == cfg.seed  # the same universes
    assert trained.optimizer.lion_cub.hierarchy == "node"
    assert load_config(REPO / "config" / "config.yaml").training_seed == cfg.seed  # null: seed


def test_one_noisy_validation_neither_sets_nor_meets_the_smoothed_target() -> None:
    # The measured Lion curve at 10 Mbit/s (docs/explanation/network_scaling_studies.md): its last
    # raw loss 0.579 is a noisy
    # upswing; the mean of its last three evaluations is 0.525.
    lion = [0.759, 0.564, 0.516, 0.449, 0.507, 0.469, 0.527, 0.579]
    # A variant whose single lucky second evaluation (0.50) met the raw target at once, but
    # whose smoothed curve only comes down to the target at its seventh evaluation.
    cub = [0.80, 0.50, 0.62, 0.58, 0.55, 0.46, 0.52, 0.56]
    rows = [
        _row("lion", 0, 0.1, 0.02, [(10.0 * (i + 1), x) for i, x in enumerate(lion)], lion[-1]),
        _row("cub", 0, 0.1, 0.01, [(5.0 * (i + 1), x) for i, x in enumerate(cub)], cub[-1]),
    ]
    raw = network.finish([dict(r) for r in rows], _with_smoothing(1))
    assert raw[0]["target_val_loss"] == 0.579 and raw[1]["time_to_target_s"] == 10.0
    out = {r["variant"]: r for r in network.finish(rows, _with_smoothing(3))}
    target = (0.469 + 0.527 + 0.579) / 3
    assert out["lion"]["target_val_loss"] == pytest.approx(target)
    assert out["lion"]["final_val_loss_smoothed"] == pytest.approx(target)
    assert out["cub"]["final_val_loss_smoothed"] == pytest.approx((0.46 + 0.52 + 0.56) / 3)
    # Lion: smoothed 0.613, 0.510 (4th evaluation, at 40 s) is the first at or below 0.525.
    assert out["lion"]["time_to_target_s"] == 40.0
    # cub: smoothed 0.640, 0.567, 0.583, 0.530, 0.510 (7th evaluation, at 35 s).
    assert out["cub"]["time_to_target_s"] == 35.0
    assert out["cub"]["speedup_vs_reference"] == pytest.approx(40.0 / 35.0)


def test_smoothing_over_more_evaluations_than_the_reference_has_uses_all_of_them() -> None:
    rows = [
        _row("lion", 0, 0.1, 0.02, [(1.0, 0.9), (2.0, 0.5)], 0.5),
        _row("cub", 0, 0.1, 0.01, [(1.0, 0.9), (2.0, 0.8), (3.0, 0.6)], 0.6),
    ]
    out = {r["variant"]: r for r in network.finish(rows, _with_smoothing(5))}
    assert out["lion"]["target_val_loss"] == pytest.approx(0.7)  # k = 2: mean of both
    assert out["lion"]["time_to_target_s"] == 2.0
    assert out["cub"]["time_to_target_s"] == 3.0  # smoothed 0.85 at 2 s, 0.7 at 3 s


def test_scaling_efficiency_is_per_core_second_against_the_same_modes_1x1() -> None:
    rows = [
        {"mode": "strong", "data": 1, "spatial": 1, "samples_per_core_s": 4.0},
        {"mode": "strong", "data": 2, "spatial": 1, "samples_per_core_s": 3.0},
        {"mode": "weak", "data": 1, "spatial": 1, "samples_per_core_s": 2.0},
        {"mode": "weak", "data": 1, "spatial": 2, "samples_per_core_s": 1.0},
        {"mode": "weak", "data": 2, "spatial": 2, "skipped": "why"},
    ]
    out = scaling.finish(rows, None)
    assert [r.get("efficiency") for r in out] == [1.0, 0.75, 1.0, 0.5, None]


def test_oversubscribed_points_get_no_efficiency_and_are_no_reference() -> None:
    rows = [
        {"mode": "strong", "data": 1, "spatial": 1, "samples_per_core_s": 4.0},
        {
            "mode": "strong",
            "data": 2,
            "spatial": 2,
            "samples_per_core_s": 1.0,
            "oversubscribed": "4 ranks of 1 thread(s) on 2 core(s)",
        },
        {
            "mode": "weak",
            "data": 1,
            "spatial": 1,
            "samples_per_core_s": 2.0,
            "oversubscribed": "1 ranks of 4 thread(s) on 2 core(s)",
        },
        {"mode": "weak", "data": 2, "spatial": 1, "samples_per_core_s": 1.0},
    ]
    out = scaling.finish(rows, None)
    assert [r.get("efficiency") for r in out] == [1.0, None, None, None]


def test_every_rank_of_a_study_gets_the_machines_share_of_its_largest_mesh() -> None:
    cfg = load_config(REPO / "config" / "config.yaml")
    per_rank = cfg.cluster.train.cpus_per_rank
    assert per_rank >= 4
    # This machine's 2 cores, meshes of up to 4 ranks: one core each, the 2x2 mesh shares them.
    assert study_cpus_per_rank(cfg, largest_ranks=4, machine_cores=2) == 1
    assert study_cpus_per_rank(cfg, largest_ranks=4, machine_cores=17) == 4
    assert study_cpus_per_rank(cfg, largest_ranks=1, machine_cores=512) == per_rank
    # On a cluster each point has its own allocation: cluster.train.cpus_per_rank per rank.
    assert study_cpus_per_rank(cfg, largest_ranks=4, machine_cores=None) == per_rank
    with pytest.raises(ValueError, match="machine_cores 0"):
        study_cpus_per_rank(cfg, largest_ranks=4, machine_cores=0)


def test_ranks_get_cores_of_their_own_when_all_fit_else_they_share() -> None:
    # 1 thread a rank on 4 cores: the 1x1 point runs on one core, as each rank of a 2x1.
    assert split_cores(range(4), 1, 1, cpus_per_rank=1) == ([[0]], 1.0)
    assert split_cores(range(4), 2, 1, cpus_per_rank=1) == ([[0], [1]], 1.0)
    assert split_cores(range(8), 2, 2, cpus_per_rank=2) == ([[0, 1, 2, 3], [4, 5, 6, 7]], 2.0)
    # 4 ranks of one thread on 2 cores: shared, half a core each (oversubscribed).
    assert split_cores([0, 1], 4, 1, cpus_per_rank=1) == ([[0, 1]] * 4, 0.5)
    assert split_cores(range(3), 2, 2, cpus_per_rank=1) == ([[0], [1]], 0.5)


def test_the_emulated_runner_gives_each_rank_its_cores_and_records_sharing(
    monkeypatch, tmp_path
) -> None:
    from cosmocub.netemu import runner as netemu_runner

    asked = {}

    def fake(**kwargs):
        asked.update(kwargs)
        node_cores, cores_per_rank = split_cores([0, 1], kwargs["nodes"], 1, 1)
        return NodesRunResult(
            returncode=0,
            nodes=kwargs["nodes"],
            ranks_per_node=1,
            rate_mbit=10.0,
            node_cores=node_cores,
            cores_per_rank=cores_per_rank,
            threads_per_rank=1,
            attempts=1,
            wall_s=1.0,
            node_tx_bytes=[0] * kwargs["nodes"],
        )

    monkeypatch.setattr(netemu_runner, "run_training_on_nodes", fake)
    cfg = load_config(REPO / "config" / "config.yaml")
    points = {p.point.name: p.launch for p in plan(cfg, "scaling")}
    args = {"config_path": tmp_path, "shards_dir": tmp_path, "out_dir": tmp_path}
    rc, record = run_emulated(points["strong_2x2"], cpus_per_rank=1, max_restarts=0, **args)
    assert rc == 0 and asked["cpus_per_rank"] == 1 and asked["nodes"] == 4
    assert (record["cores_per_rank"], record["threads_per_rank"]) == (0.5, 1)
    assert record["oversubscribed"] is True
    assert record["rate_set_by_runner"] is True  # netemu shaped the links
    rc, record = run_emulated(points["strong_2x1"], cpus_per_rank=1, max_restarts=0, **args)
    assert (record["cores_per_rank"], record["oversubscribed"]) == (1.0, False)


def test_a_scaling_study_marks_oversubscribed_meshes_and_leaves_their_efficiency_empty(
    tmp_path,
) -> None:
    cfg = load_config(REPO / "config" / "config.yaml")
    assert [p.name for p in scaling.points(cfg)] == [
        f"{mode}_{mesh}" for mode in ("strong", "weak") for mesh in ("1x1", "2x1", "1x2", "2x2")
    ]
    write_scaling_outputs(cfg, tmp_path, oversubscribed={"strong_2x2", "weak_2x2"})
    gather_study(cfg, "scaling", tmp_path)
    with open(tmp_path / "points.tsv") as f:
        table = {r["point"]: r for r in csv.DictReader(f, delimiter="\t")}
    assert table["strong_2x2"]["oversubscribed"] == "4 ranks of 1 thread(s) on 2 core(s)"
    assert table["strong_2x2"]["step_s"] != "" and table["strong_2x2"]["efficiency"] == ""
    assert all(table[p]["oversubscribed"] == "" for p in ("strong_1x1", "weak_2x1"))

    def per_core(data, spatial, local, global_batch):
        return global_batch / (sum(point_times(data, spatial, local).values()) * data * spatial)

    # Strong: a global batch of 4 (local 4, 2, 4 on 1x1, 2x1, 1x2); weak: 2 per data rank.
    assert float(table["strong_2x1"]["efficiency"]) == pytest.approx(
        per_core(2, 1, 2, 4) / per_core(1, 1, 4, 4), rel=1e-5
    )
    assert float(table["weak_1x2"]["efficiency"]) == pytest.approx(
        per_core(1, 2, 2, 2) / per_core(1, 1, 2, 2), rel=1e-5
    )
    summary = (tmp_path / "summary.md").read_text()
    assert "its efficiency is left empty" in summary


def test_without_cap_net_admin_the_emulated_runner_skips(monkeypatch, tmp_path) -> None:
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu import runner as netemu_runner

    def refuse(**kwargs):
        raise EmulationUnavailableError("network namespaces need CAP_NET_ADMIN")

    monkeypatch.setattr(netemu_runner, "run_training_on_nodes", refuse)
    cfg = load_config(REPO / "config" / "test.yaml")
    launch = plan(cfg, "network")[0].launch
    with pytest.raises(PointSkipped, match="CAP_NET_ADMIN"):
        run_emulated(
            launch,
            config_path=tmp_path / "c.yaml",
            shards_dir=tmp_path,
            out_dir=tmp_path / "r",
            cpus_per_rank=1,
            max_restarts=0,
        )


def test_a_study_of_skipped_points_gathers_their_labels_and_why(tmp_path) -> None:
    cfg = load_config(REPO / "config" / "test.yaml")
    for p in plan(cfg, "network"):
        extra = {"skipped": "emulated nodes unavailable: no CAP_NET_ADMIN", "ranks_per_node": 1}
        record = point_record(p.launch, cores_per_rank=1, extra=extra)
        write_point_record(record, tmp_path / p.point.name)
    rows = gather_study(cfg, "network", tmp_path)
    assert len(rows) == 2
    with open(tmp_path / "points.tsv") as f:
        table = list(csv.DictReader(f, delimiter="\t"))
    assert [(r["variant"], r["rate_mbit"]) for r in table] == [
        ("lion", "10"),
        ("lion_cub_1bit", "10"),
    ]
    assert all(r["skipped"].startswith("emulated nodes unavailable") for r in table)
    assert all(r["step_s"] == "" and r["time_to_target_s"] == "" for r in table)


def test_study_point_config_writes_the_plan_that_study_point_runs(
    monkeypatch, tmp_path, capsys
) -> None:
    import json

    from cosmocub import cli
    from cosmocub.studies import runners

    folder = tmp_path / "lion_10mbit"
    base = ["--config", str(REPO / "config" / "test.yaml"), "--study", "network"]
    args = ["study-point-config", *base, "--point", "lion_10mbit"]
    assert cli.main([*args, "--out", str(folder / "config.yaml")]) == 0
    written = json.loads((folder / "launch.json").read_text())
    assert written == {
        "study": "network",
        "name": "lion_10mbit",
        "runner": "emulated",
        "labels": {"variant": "lion", "rate_mbit": 10, "seed": 0},
        "launch": {"nodes": 2, "ranks_per_node": 1, "rate_mbit": 10},
        "nodes": 2,
        "ranks_per_node": 1,
        "rate_mbit": 10.0,
    }
    seen = []

    def fake(plan, **kwargs):
        seen.append((plan.nodes, plan.ranks_per_node, plan.rate_mbit, plan.ranks))
        return 0, {"nodes": plan.nodes, "ranks_per_node": plan.ranks_per_node}

    monkeypatch.setitem(runners.RUNNERS, "emulated", fake)
    # The base config is not read again (study-point takes none): only the plan beside the
    # point's config.
    args = ["study-point", "--study", "network"]
    args += ["--point-config", str(folder / "config.yaml"), "--shards", str(tmp_path)]
    assert cli.main([*args, "--point", "lion_10mbit", "--out", str(folder)]) == 0
    assert seen == [(2, 1, 10.0, 2)]
    record = json.loads((folder / "point.json").read_text())
    assert (record["launch"], record["runner"]) == (written["launch"], "emulated")
    # A plan of another point is refused, naming the file.
    capsys.readouterr()
    assert cli.main([*args, "--point", "lion_0mbit", "--out", str(folder)]) == 2
    assert "launch.json: the plan of study 'network' point 'lion_10mbit', not of study " in (
        capsys.readouterr().err
    )
    (folder / "launch.json").unlink()
    assert cli.main([*args, "--point", "lion_10mbit", "--out", str(folder)]) == 2
    assert (
        "launch.json: not found (cosmocub study-point-config writes it" in capsys.readouterr().err
    )
    assert seen == [(2, 1, 10.0, 2)]
