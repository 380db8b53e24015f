"""The MLPerf log reader (perfmodel.uses.mllog) on a small synthetic mllog file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosmocub.perfmodel.uses.mllog import read_events, run_times, system_description


def line(key: str, t_ms: float, value: object = None, **metadata: object) -> str:
    record = {
        "namespace": "",
        "time_ms": t_ms,
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": {"file": "x.py", "lineno": 1, **metadata},
    }
    return ":::MLLOG " + json.dumps(record)


def write_log(path: Path, *, staging_first: bool) -> None:
    """Two epochs of 10 s with a 1 s evaluation inside each, a third that ends after run_stop,
    staging of 5 s before or after run_start, a duplicated line and noise."""
    t0 = 1_000_000.0
    stage = [line("staging_start", t0 + 100), line("staging_stop", t0 + 5_100)]
    head = [
        "some launcher output",
        line("submission_org", t0, "Org"),
        line("submission_platform", t0, "2xBox"),
        line("number_of_nodes", t0, 2),
        line("accelerators_per_node", t0, 4),
        line("global_batch_size", t0, 8),
        line("train_samples", t0, 80),
        line("eval_samples", t0, 16),
    ]
    run0 = t0 + (6_000 if staging_first else 0)
    body = [line("run_start", run0)]
    for n in (1, 2, 3):
        e0 = run0 + 10_000 + (n - 1) * 10_000
        body += [
            line("epoch_start", e0, epoch_num=n),
            line("eval_start", e0 + 8_500, epoch_num=n),
            line("eval_stop", e0 + 9_500, epoch_num=n),
            line("epoch_stop", e0 + 10_000, epoch_num=n),
        ]
    body.insert(3, body[2])  # a line logged twice
    body.insert(-4, line("run_stop", run0 + 30_500, status="success"))
    body.append(':::MLLOG {"key": "cut off')
    lines = head + (stage + body if staging_first else body[:1] + stage + body[1:])
    path.write_text("\n".join(lines) + "\n")


def test_the_reader_takes_eval_out_of_each_epoch_and_stops_at_run_stop(tmp_path: Path) -> None:
    path = tmp_path / "result_0.txt"
    write_log(path, staging_first=False)
    events = read_events(path)
    assert sum(e.key == "eval_start" for e in events) == 3  # the duplicate line read once
    run = run_times(path)
    assert run.epochs == 2  # the third epoch ends after run_stop
    assert run.train_epoch_s == (9.0, 9.0) and run.eval_s == (1.0, 1.0)
    assert (run.nodes, run.accelerators_per_node, run.global_batch) == (2, 4, 8)
    assert run.steps_per_epoch == 10 and run.step_s == pytest.approx(0.9)
    assert run.run_s == pytest.approx(30.5)
    assert run.staging_s == pytest.approx(5.0) and run.staging_in_run is True
    assert (run.org, run.platform) == ("Org", "2xBox")


def test_staging_before_run_start_is_outside_the_timed_run(tmp_path: Path) -> None:
    path = tmp_path / "result_0.txt"
    write_log(path, staging_first=True)
    run = run_times(path)
    assert run.staging_in_run is False and run.staging_s == pytest.approx(5.0)


def test_a_log_without_a_run_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "result_0.txt"
    path.write_text(line("epoch_start", 1.0, epoch_num=1) + "\n")
    with pytest.raises(ValueError, match=r"result_0\.txt: no run_start/run_stop"):
        run_times(path)


def test_the_system_description_is_found_beside_the_results(tmp_path: Path) -> None:
    log = tmp_path / "v9" / "Org" / "results" / "box_n2" / "strong" / "cosmoflow" / "result_0.txt"
    log.parent.mkdir(parents=True)
    write_log(log, staging_first=False)
    assert system_description(log) == ("box_n2", None)
    systems = tmp_path / "v9" / "Org" / "systems"
    systems.mkdir()
    (systems / "box_n2.json").write_text(json.dumps({"accelerator_model_name": "GPU"}))
    assert system_description(log) == ("box_n2", {"accelerator_model_name": "GPU"})
