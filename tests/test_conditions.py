"""Machine conditions of a run: CPU and ready shares, their reduction over ranks, the contended
mark of a study point, its rerun, and what efficiencies and model errors leave out."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from study_tables import gather_study

from cosmocub.config import StudiesConfig, load_config
from cosmocub.contention.conditions import (
    Sample,
    cpu_share,
    rank_conditions,
    ready_share,
    reduce_over_ranks,
)
from cosmocub.contention.marks import (
    conditions_note,
    is_contended,
    kept,
    measured_epochs,
    own_share,
    point_conditions,
    why_contended,
)
from cosmocub.contention.probes import (
    parse_proc_stat,
    parse_schedstat,
    read_core_ticks,
    read_sched_ns,
    steal_share,
)
from cosmocub.perfmodel.uses.validate import error_summary
from cosmocub.studies import runners, scaling
from cosmocub.studies.engine import definition, write_point_record

REPO = Path(__file__).resolve().parents[1]
LIMITS = StudiesConfig(contended_ready_share=0.7, contended_steal_share=0.1)


def _sample(
    wall: float, cpu: float, nivcsw: int, load: float, sched: dict | None, ticks=None
) -> Sample:
    return Sample(
        wall_s=wall, cpu_s=cpu, nivcsw=nivcsw, load_1m=load, sched_ns=sched, core_ticks=ticks
    )


def test_cpu_share_is_cpu_over_wall_times_the_fewer_of_threads_and_cores() -> None:
    assert cpu_share(3.0, 2.0, threads=2, cores=4) == pytest.approx(0.75)
    assert cpu_share(3.0, 2.0, threads=4, cores=2) == pytest.approx(0.75)
    assert cpu_share(1.0, 2.0, threads=1, cores=8) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"wall 0\.0 s"):
        cpu_share(1.0, 0.0, threads=1, cores=1)


def test_ready_share_counts_waits_for_a_core_only() -> None:
    assert ready_share(3.0, 1.0) == pytest.approx(0.75)
    assert ready_share(0.0, 0.0) == 1.0  # never runnable: never kept from a core
    assert parse_schedstat("202369 3072149 2\n") == (202369, 3072149)


PROC_STAT = """cpu  58693 0 16952 91182 700 0 2105 14407 0 0
cpu0 30000 10 8000 45000 300 5 1000 7000 0 0
cpu1 28693 0 8952 46182 400 0 1105 7407 0 0
intr 12345 0 0
"""


def test_steal_is_read_per_core_from_proc_stat_over_the_busy_time() -> None:
    # busy = user + nice + system + irq + softirq; idle and iowait are not busy
    assert parse_proc_stat(PROC_STAT, {0}) == (30000 + 10 + 8000 + 5 + 1000, 7000)
    assert parse_proc_stat(PROC_STAT, {0, 1}) == (39015 + 38750, 14407)
    with pytest.raises(ValueError, match=r"/proc/stat: no line for cpu \[2\]"):
        parse_proc_stat(PROC_STAT, {1, 2})
    assert steal_share(70, 30) == pytest.approx(0.3)
    assert steal_share(0, 0) == 0.0  # idle cores: nothing to steal
    ticks = read_core_ticks()
    if ticks is None:
        pytest.skip("no /proc/stat here")
    busy, stolen = ticks
    assert busy > 0 and stolen >= 0  # this process has run on its cores
    # A rank's share between two samples: 300 busy ticks, 100 stolen.
    c = rank_conditions(
        _sample(0, 0, 0, 0, None, (1000, 50)),
        _sample(1, 1, 0, 0, None, (1300, 150)),
        threads=1,
        cores=1,
    )
    assert c["steal_share"] == pytest.approx(0.25)
    # 90 ticks of work between them (under a core-second): too short to read a share from
    short = rank_conditions(
        _sample(0, 0, 0, 0, None, (1000, 50)),
        _sample(1, 1, 0, 0, None, (1080, 60)),
        threads=1,
        cores=1,
    )
    assert math.isnan(short["steal_share"])
    assert "steal_share" not in reduce_over_ranks([c, short])  # not judged on a rank without
    assert math.isnan(
        rank_conditions(_sample(0, 0, 0, 0, None), _sample(1, 1, 0, 0, None), threads=1, cores=1)[
            "steal_share"
        ]
    )


def test_rank_conditions_between_two_samples_follow_threads_by_id() -> None:
    start = _sample(10.0, 5.0, 3, 0.5, {1: (1_000_000_000, 0), 2: (0, 0), 9: (7, 7)})
    # thread 3 started in between (counts from zero); thread 9 ended (its counts go with it)
    end = _sample(
        12.0,
        8.0,
        13,
        1.5,
        {1: (2_000_000_000, 1_000_000_000), 2: (500_000_000, 0), 3: (500_000_000, 0)},
    )
    c = rank_conditions(start, end, threads=2, cores=4)
    assert c["wall_s"] == 2.0 and c["cpu_s"] == 3.0
    assert c["cpu_share"] == pytest.approx(0.75)
    assert c["ready_share"] == pytest.approx(2.0 / 3.0)  # ran 2 s, waited 1 s
    assert (c["nivcsw"], c["load_1m_start"], c["load_1m_end"]) == (10.0, 0.5, 1.5)
    assert (c["torch_threads"], c["cores_granted"]) == (2.0, 4.0)
    no_sched = rank_conditions(_sample(0, 0, 0, 0, None), end, threads=1, cores=1)
    assert math.isnan(no_sched["ready_share"])


def test_reduction_over_ranks_keeps_the_worst_served_rank_and_sums_switches() -> None:
    ranks = [
        {
            "cpu_s": 2.0,
            "wall_s": 4.0,
            "cpu_share": 0.5,
            "ready_share": 0.9,
            "nivcsw": 10.0,
            "load_1m_start": 1.0,
            "load_1m_end": 2.0,
            "torch_threads": 1.0,
            "cores_granted": 2.0,
        },
        {
            "cpu_s": 4.0,
            "wall_s": 4.5,
            "cpu_share": 0.9,
            "ready_share": 0.4,
            "nivcsw": 30.0,
            "load_1m_start": 1.5,
            "load_1m_end": 1.0,
            "torch_threads": 1.0,
            "cores_granted": 1.0,
        },
    ]
    out = reduce_over_ranks(ranks)
    assert out == {
        "cpu_s": 3.0,
        "wall_s": 4.5,
        "cpu_share": 0.5,
        "ready_share": 0.4,
        "nivcsw": 40.0,
        "load_1m_start": 1.5,
        "load_1m_end": 2.0,
        "torch_threads": 1.0,
        "cores_granted": 1.0,
    }
    ranks[1]["ready_share"] = math.nan  # a rank without schedstat: no ready_share at all
    assert "ready_share" not in reduce_over_ranks(ranks)
    ranks[0]["steal_share"], ranks[1]["steal_share"] = 0.02, 0.3
    assert reduce_over_ranks(ranks)["steal_share"] == 0.3  # the most stolen rank's


def _epoch(step: int, cpu: float, ready: float | None, load: float, nivcsw: float) -> dict:
    e = {
        "step": step,
        "cpu_share": cpu,
        "load_1m_start": load,
        "load_1m_end": load / 2,
        "nivcsw": nivcsw,
    }
    return e if ready is None else {**e, "ready_share": ready}


def test_point_conditions_are_step_weighted_over_the_epochs_after_the_first() -> None:
    epochs = [
        _epoch(4, 0.1, 0.1, 9.0, 999),
        _epoch(8, 0.8, 0.9, 1.0, 8),
        _epoch(16, 0.5, 0.6, 2.0, 16),
    ]
    assert [e["step"] for _, e in measured_epochs(epochs)] == [8, 16]
    c = point_conditions(epochs)
    assert c["cpu_share"] == pytest.approx((4 * 0.8 + 8 * 0.5) / 12)
    assert c["ready_share"] == pytest.approx((4 * 0.9 + 8 * 0.6) / 12)
    assert c["load_1m"] == 2.0  # the first epoch's 9.0 is start-up, left out
    assert c["nivcsw_per_step"] == pytest.approx(24 / 12)
    assert point_conditions(epochs[:1])["cpu_share"] == 0.1  # one epoch: that one
    assert point_conditions([{"step": 4}]) == {}  # a run from before conditions were recorded
    assert "ready_share" not in point_conditions([_epoch(4, 0.5, None, 1.0, 0)])
    assert "steal_share" not in c  # a run from before steal was recorded
    stolen = [{**e, "steal_share": v} for e, v in zip(epochs, (0.9, 0.05, 0.2), strict=True)]
    assert point_conditions(stolen)["steal_share"] == pytest.approx((4 * 0.05 + 8 * 0.2) / 12)


def test_contended_is_below_the_threshold_in_ready_share_or_above_it_in_steal() -> None:
    assert is_contended({"cpu_share": 0.9, "ready_share": 0.5}, LIMITS)
    # A rank waiting on a slow link has a low cpu_share but got every core it was ready for.
    assert not is_contended({"cpu_share": 0.2, "ready_share": 0.95}, LIMITS)
    assert not is_contended({"cpu_share": 0.2}, LIMITS)  # no schedstat: not judged (the note says)
    # The host's other guests took its cores: every share inside the machine looks quiet.
    stolen = {"cpu_share": 0.9, "ready_share": 0.95, "steal_share": 0.29}
    assert is_contended(stolen, LIMITS)
    assert why_contended(stolen, LIMITS) == "steal share 0.29 > 0.1"
    assert not is_contended({**stolen, "steal_share": 0.03}, LIMITS)
    # Four one-thread ranks on two cores wait for each other: judged against the half they leave
    assert own_share(0.5, 1) == 0.5 and own_share(2.0, 1) == 1.0 and own_share(None, None) == 1.0
    shared = {"cpu_share": 0.5, "ready_share": 0.4}
    assert is_contended(shared, LIMITS) and not is_contended(shared, LIMITS, expected_ready=0.5)
    assert why_contended({"ready_share": 0.3}, LIMITS, expected_ready=0.5) == (
        "ready share 0.30 < 0.35"
    )


def test_contended_points_leave_efficiencies_and_model_errors_and_the_report_says_so() -> None:
    rows = [
        {
            "point": "strong_1x1",
            "mode": "strong",
            "data": 1,
            "spatial": 1,
            "samples_per_core_s": 4.0,
            "contended": False,
            "cpu_share": 0.9,
            "ready_share": 0.95,
        },
        {
            "point": "strong_2x1",
            "mode": "strong",
            "data": 2,
            "spatial": 1,
            "samples_per_core_s": 3.0,
            "contended": False,
            "cpu_share": 0.9,
            "ready_share": 0.9,
        },
        {
            "point": "strong_1x2",
            "mode": "strong",
            "data": 1,
            "spatial": 2,
            "samples_per_core_s": 0.5,
            "contended": True,
            "cpu_share": 0.4,
            "ready_share": 0.45,
        },
    ]
    out = scaling.finish(rows, None)
    assert [r.get("efficiency") for r in out] == [1.0, 0.75, None]
    # A contended reference gives no efficiencies at all rather than ones against a busy machine.
    fresh = [{k: v for k, v in r.items() if k != "efficiency"} for r in rows[:2]]
    busy_base = [{**fresh[0], "contended": True}, fresh[1]]
    assert [r.get("efficiency") for r in scaling.finish(busy_base, None)] == [None, None]
    note = conditions_note(rows, LIMITS)
    assert note.startswith("1 of 3 points left out of efficiencies, fits and model errors")
    assert note.endswith("strong_1x2.") and "< 0.7 of the time" in note
    assert conditions_note(rows[:2], LIMITS) == ""
    # As perf-model validate reads them back from points.tsv (strings) and compares them.
    results = [
        {"point": "a", "rel_error_step": 0.1, "contended": False},
        {"point": "b", "rel_error_step": -0.3, "contended": False},
        {"point": "c", "rel_error_step": 5.0, "contended": True},
    ]
    assert error_summary(results) == {
        "median": pytest.approx(0.2),
        "worst": pytest.approx(0.3),
        "points": 2,
    }
    tsv_rows = [{"point": "a", "contended": "False"}, {"point": "c", "contended": "True"}]
    assert [r["point"] for r in kept(tsv_rows)] == ["a"]


def _fake_run(run_dir: Path, ready: float) -> None:
    run_dir.mkdir(parents=True)
    lines = [_epoch(4, 0.9, 0.99, 1.0, 0), _epoch(8, 0.9, ready, 1.0, 4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_a_contended_run_is_moved_aside_and_run_once_more(tmp_path: Path) -> None:
    def attempt(*, out_dir: Path):
        _fake_run(out_dir, 0.8)
        return 0, {"nodes": 1}

    run = tmp_path / "p" / "run"
    _fake_run(run, 0.4)
    rc, extra = runners.rerun_if_contended(attempt, {"nodes": 1}, run_dir=run, limits=LIMITS)
    assert rc == 0 and extra["contended"] is False and extra["nodes"] == 1
    assert [(a["run"], a["ready_share"], a["contended"]) for a in extra["runs"]] == [
        ("run_contended", 0.4, True),
        ("run", 0.8, False),
    ]
    assert (tmp_path / "p" / "run_contended" / "metrics.jsonl").is_file()
    # Contended twice: marked, both attempts kept; a quiet first run is not rerun.
    again = tmp_path / "q" / "run"
    _fake_run(again, 0.3)
    rc, extra = runners.rerun_if_contended(
        lambda out_dir: (_fake_run(out_dir, 0.5), (0, {}))[1], {}, run_dir=again, limits=LIMITS
    )
    assert extra["contended"] is True
    assert [a["ready_share"] for a in extra["runs"]] == [0.3, 0.5]
    quiet = tmp_path / "r" / "run"
    _fake_run(quiet, 0.95)
    rc, extra = runners.rerun_if_contended(None, {}, run_dir=quiet, limits=LIMITS)
    assert extra["contended"] is False and len(extra["runs"]) == 1
    # A study whose numbers are not times (the known-answer study) keeps a contended run.
    kept = tmp_path / "s" / "run"
    _fake_run(kept, 0.3)
    rc, extra = runners.rerun_if_contended(None, {}, run_dir=kept, limits=LIMITS, rerun=False)
    assert extra["contended"] is True and [a["run"] for a in extra["runs"]] == ["run"]
    assert kept.is_dir() and not kept.with_name("run_contended").exists()
    assert definition("known_answer").timed is False and definition("step_time").timed is True


def test_gather_shows_the_mark_in_points_tsv_and_the_report_counts_what_is_left_out(
    tmp_path: Path,
) -> None:
    cfg = load_config(REPO / "config" / "test.yaml")  # step-time points dp1, dp2
    summary = {"world_size": 1, "data_parallel": 1, "spatial_parallel": 1, "steps": 8}
    for name, ready, attempts in (("dp1", 0.95, [0.95]), ("dp2", 0.3, [0.2, 0.3])):
        _fake_run(tmp_path / name / "run", ready)
        (tmp_path / name / "run" / "train_summary.json").write_text(json.dumps(summary))
        record = {
            "point": name,
            "nodes": 1,
            "ranks_per_node": 1,
            "contended": ready < 0.7,
            "runs": [{"ready_share": a} for a in attempts],
        }
        write_point_record(record, tmp_path / name)
    gather_study(cfg, "step_time", tmp_path)
    with open(tmp_path / "points.tsv") as f:
        table = list(csv.DictReader(f, delimiter="\t"))
    cells = [(r["point"], r["contended"], r["runs"], r["first_ready_share"]) for r in table]
    assert cells == [("dp1", "False", "1", ""), ("dp2", "True", "2", "0.2")]
    assert [float(r["ready_share"]) for r in table] == [0.95, 0.3]  # the measured epoch's
    assert float(table[0]["nivcsw_per_step"]) == 1.0 and float(table[0]["load_1m"]) == 1.0
    text = (tmp_path / "summary.md").read_text()
    assert "1 of 2 points left out of efficiencies, fits and model errors as contended" in text
    threshold = cfg.studies.contended_ready_share  # the report names the config's
    assert f"< {threshold:g} of the time they were ready to" in text and "dp2." in text


def test_schedstat_is_read_for_every_thread_of_this_process() -> None:
    sched = read_sched_ns()
    if sched is None:
        pytest.skip("this kernel keeps no /proc/self/task/*/schedstat")
    assert os.getpid() in sched and all(ran >= 0 and waited >= 0 for ran, waited in sched.values())


HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@pytest.mark.slow
def test_a_point_beside_a_cpu_hog_is_marked_contended_and_alone_it_is_not(tmp_path, monkeypatch):
    """A tiny step-time point trained in this process: pinned to one core beside two busy loops
    pinned there too it gets about a third of it (ready share 0.2-0.35 measured, both runs, so
    it is marked); alone, on the cores this test has, it gets one whenever it is ready (0.93-0.99
    measured at load 0.3-3.6 on 2 shared cores). Alone it is not pinned, and is asserted not
    contended only while the load average is below the cores: on a machine other jobs share,
    they do what the hogs do (seen: a first run alone at 0.43, load 3.1 on 2 cores, its rerun
    0.94; pinned to one core, 0.67 then 0.93), and the test would measure the neighbours."""
    from shard_fixtures import make_random_shards

    from cosmocub.train.main import train

    if read_sched_ns() is None:
        pytest.skip("this kernel keeps no /proc/self/task/*/schedstat")
    shards = make_random_shards(tmp_path / "shards", counts={"train": 96, "val": 8}, size=8)
    overrides = {
        "results": str(tmp_path / "results"),
        "tracking": {"enabled": False},
        "train": {"threads_per_rank": 1},
    }
    cfg = load_config(REPO / "config" / "test.yaml", overrides=overrides)

    def in_process(plan, *, config_path, shards_dir, out_dir, cpus_per_rank, max_restarts):
        train(load_config(config_path), shards_dir=shards_dir, run_dir=out_dir)
        return 0, {"nodes": 1, "ranks_per_node": 1}

    monkeypatch.setitem(runners.RUNNERS, "local", in_process)
    core = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)

    def run(name: str) -> dict:
        config = tmp_path / name / "config.yaml"
        runners.prepare_point(cfg, "step_time", "dp1", config)
        rc = runners.run_point(
            study="step_time",
            point="dp1",
            point_config_path=config,
            shards_dir=shards,
            out=tmp_path / name,
            cpus_per_rank=1,
            max_restarts=0,
        )
        assert rc == 0
        return json.loads((tmp_path / name / "point.json").read_text())

    alone = run("alone")
    hogs = []
    try:
        os.sched_setaffinity(0, {core})
        hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(core)]) for _ in range(2)]
        busy = run("busy")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, before)
    print("alone", alone["runs"], "\nbusy", busy["runs"], file=sys.stderr)
    assert busy["contended"] is True and len(busy["runs"]) == 2
    assert all(a["ready_share"] < 0.6 for a in busy["runs"])
    best_alone = max(a["ready_share"] for a in alone["runs"])
    assert best_alone > max(a["ready_share"] for a in busy["runs"]) + 0.2
    if alone["runs"][-1]["load_1m"] < len(before):
        # after its rerun, if the first met a busy moment; the host's other guests (steal) are not
        # what this test holds still, so a point they contend is let be (seen once in CI: 0.16
        # then 0.10 of two short epochs' ticks stolen, ready share 0.90 and 0.98)
        last = alone["runs"][-1]
        assert last["ready_share"] >= cfg.studies.contended_ready_share
        steal_limit = cfg.studies.contended_steal_share
        assert alone["contended"] is False or last.get("steal_share", 0) > steal_limit
