"""MLflow tracking against real stores: SQLite in tmp_path, and a real `mlflow server` subprocess;
parent/child runs read back with MlflowClient, failures, disabled tracking, unreachable stores."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from cosmocub.cli import main as cli_main
from cosmocub.config import flatten, load_config
from cosmocub.tracking.runs import (
    PARENT_RUN_ENV,
    SCHEDULER_JOB_ENVS,
    end_workflow_run,
    job_run,
    start_workflow_run,
)
from cosmocub.tracking.store import (
    TrackingUnavailable,
    artifact_location,
    init_store,
    tracking_uri,
)
from cosmocub.tracking.tracker import NullTracker, Tracker
from cosmocub.tracking.workflow_run import TARGETS_TAG, finish_tracking, start_tracking

JOB_ENVS = (
    "COSMOCUB_PARENT_RUN_ID",
    "COSMOCUB_RULE",
    "COSMOCUB_WILDCARDS",
    *SCHEDULER_JOB_ENVS.values(),
)


@pytest.fixture(autouse=True)
def clean_job_env(monkeypatch):
    # A test run under Slurm, or inside a workflow, must not leak its ids into these runs.
    for name in JOB_ENVS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def empty_store_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("store-template")
    MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}").search_experiments()
    return root / "mlflow.db"


@pytest.fixture
def store(tmp_path, empty_store_db):
    """A migrated, empty SQLite store at the default place: MLflow's migrations take seconds."""
    (tmp_path / "results").mkdir()
    shutil.copy(empty_store_db, tmp_path / "results" / "mlflow.db")


def make_cfg(tmp_path, **tracking_overrides):
    overrides = {"results": str(tmp_path / "results"), "tracking": {"system_metrics": False}}
    overrides["tracking"].update(tracking_overrides)
    return load_config(None, overrides=overrides)


def client_for(cfg) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri(cfg))


def expected_params(cfg, extra=None):
    values = {**flatten(cfg.values), **(extra or {})}
    # Non-strings as JSON, so lists, null and booleans read as they do in the YAML config.
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


# ---------------------------------------------------------------------------------------------
# SQLite store


def test_default_store_is_sqlite_in_results_with_absolute_artifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, overrides={"results": "results", "tracking": {"system_metrics": False}})
    assert tracking_uri(cfg) == f"sqlite:///{tmp_path}/results/mlflow.db"
    experiment_id = init_store(cfg)
    assert init_store(cfg) == experiment_id  # idempotent
    experiment = client_for(cfg).get_experiment(experiment_id)
    assert experiment.name == "cosmocub"
    assert experiment.artifact_location == (tmp_path / "results" / "mlartifacts").as_uri()


def test_user_sqlite_uri_keeps_artifacts_beside_its_database(tmp_path, empty_store_db):
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(empty_store_db, tmp_path / "elsewhere" / "team.db")
    cfg = make_cfg(tmp_path, uri=f"sqlite:///{tmp_path}/elsewhere/team.db")
    experiment = client_for(cfg).get_experiment(init_store(cfg))
    assert experiment.artifact_location == (tmp_path / "elsewhere" / "mlartifacts").as_uri()
    assert not (tmp_path / "results").exists()


def test_parent_and_child_runs_read_back(store, tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    parent = start_workflow_run(cfg, name="wf-test")
    monkeypatch.setenv("COSMOCUB_PARENT_RUN_ID", parent)
    monkeypatch.setenv("COSMOCUB_RULE", "train")
    monkeypatch.setenv("COSMOCUB_WILDCARDS", "run=default,seed=3")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with job_run(cfg, stage="train", params={"world_size": 2}) as tracker:
        for step, loss in enumerate([0.9, 0.5, 0.25]):
            tracker.log_metrics({"train_loss": loss}, step=step * 10)
        tracker.set_tags({"note": "hello"})
        child = tracker.run_id
    end_workflow_run(cfg, parent, "FINISHED")

    client = client_for(cfg)
    run = client.get_run(child)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "train[run=default,seed=3]"
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent
    assert tags["rule"] == "train"
    assert tags["stage"] == "train"
    assert tags["wildcards"] == "run=default,seed=3"
    assert tags["wildcard.seed"] == "3"
    assert tags["config_hash"] == cfg.hash
    assert tags["scheduler"] == "slurm"
    assert tags["scheduler_job_id"] == "4242"
    assert tags["host"] == socket.gethostname()
    assert tags["note"] == "hello"
    assert run.data.params == expected_params(cfg, {"world_size": 2})
    assert run.data.params["model.dense_sizes"] == "[128, 64]"
    history = client.get_metric_history(child, "train_loss")
    assert [(m.step, m.value) for m in history] == [(0, 0.9), (10, 0.5), (20, 0.25)]
    assert "config.yaml" in {a.path for a in client.list_artifacts(child)}
    config_file = client.download_artifacts(child, "config.yaml", str(tmp_path))
    with open(config_file) as f:
        assert yaml.safe_load(f) == cfg.values
    # The artifacts sit in the results folder, never in the job's working directory.
    assert (tmp_path / "results" / "mlartifacts").is_dir()

    parent_run = client.get_run(parent)
    assert parent_run.info.status == "FINISHED"
    assert parent_run.info.run_name == "wf-test"
    assert parent_run.data.tags["cosmocub.kind"] == "workflow"
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    assert [r.info.run_id for r in children] == [child]


def test_a_studys_points_are_children_of_its_gather_run_under_the_named_workflow_run(
    store, tmp_path, monkeypatch
):
    from study_outputs import write_scaling_outputs

    from cosmocub.studies.gather import gather_study

    cfg = load_config(
        None,
        overrides={
            "results": str(tmp_path / "results"),
            "tracking": {"system_metrics": False},
            "scaling_study": {"meshes": [[1, 1], [2, 1]], "modes": ["strong"]},
        },
    )
    monkeypatch.setenv(PARENT_RUN_ENV, "")  # start_tracking sets it; restored after the test
    start_tracking(cfg, ["scaling_study"])  # what the Snakefile's onstart does
    workflow_run = os.environ[PARENT_RUN_ENV]
    points = {}
    for name in ("strong_1x1", "strong_2x1"):  # each point's training, in its study_point job
        monkeypatch.setenv("COSMOCUB_RULE", "study_point")
        monkeypatch.setenv("COSMOCUB_WILDCARDS", f"study=scaling,point={name}")
        with job_run(cfg, stage="train") as tracker:
            points[name] = tracker.run_id
    folder = tmp_path / "results" / "studies" / "scaling"
    write_scaling_outputs(cfg, folder, run_ids=points)
    monkeypatch.setenv("COSMOCUB_RULE", "study_gather")
    monkeypatch.setenv("COSMOCUB_WILDCARDS", "study=scaling")
    gather_study(cfg, "scaling", folder=folder)
    finish_tracking(cfg, "FINISHED")

    client = client_for(cfg)
    parent = client.get_run(workflow_run)
    assert parent.info.run_name == "scaling_study"
    assert parent.data.tags[TARGETS_TAG] == "scaling_study"
    assert "mlflow.parentRunId" not in parent.data.tags
    experiment = [parent.info.experiment_id]
    (gather_run,) = client.search_runs(experiment, filter_string="tags.rule = 'study_gather'")
    assert gather_run.info.run_name == "study_gather[study=scaling]"
    assert gather_run.data.tags["mlflow.parentRunId"] == workflow_run
    children = client.search_runs(
        experiment, filter_string=f"tags.mlflow.parentRunId = '{gather_run.info.run_id}'"
    )
    assert sorted(r.info.run_id for r in children) == sorted(points.values())
    for name, run_id in points.items():
        tags = client.get_run(run_id).data.tags
        assert (tags["cosmocub.study"], tags["cosmocub.point"]) == ("scaling", name)
    rows = {r["point"]: r for r in csv_rows(folder / "points.tsv")}
    step = client.get_run(points["strong_2x1"]).data.metrics["study.step_s"]
    assert step == pytest.approx(float(rows["strong_2x1"]["step_s"]), rel=1e-5)
    # The workflow's own children: the two trainings moved under the gather run.
    direct = client.search_runs(
        experiment, filter_string=f"tags.mlflow.parentRunId = '{workflow_run}'"
    )
    assert [r.info.run_id for r in direct] == [gather_run.info.run_id]


def csv_rows(path):
    import csv

    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_failing_job_marks_child_failed_and_reraises(store, tmp_path):
    cfg = make_cfg(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), job_run(cfg, stage="evaluate") as tracker:
        run_id = tracker.run_id
        tracker.log_metrics({"partial": 1.0})
        raise RuntimeError("boom")
    run = client_for(cfg).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.metrics == {"partial": 1.0}
    assert run.data.tags["rule"] == "evaluate"  # no COSMOCUB_RULE: the stage
    assert "mlflow.parentRunId" not in run.data.tags


@pytest.mark.parametrize("how", ["config", "rank"])
def test_disabled_logs_nothing(tmp_path, how):
    cfg = make_cfg(tmp_path, enabled=(how != "config"))
    with job_run(cfg, stage="train", enabled=(how != "rank")) as tracker:
        assert isinstance(tracker, NullTracker) and tracker.run_id is None
        tracker.log_params({"a": 1})
        tracker.log_metrics({"loss": 1.0}, step=1)
        tracker.log_artifact(tmp_path / "does-not-matter")
        tracker.log_model(torch.nn.Linear(2, 2))
        tracker.set_tags({"t": 1})
    assert not (tmp_path / "results").exists()
    if how == "config":
        assert start_workflow_run(cfg) == ""


def test_log_model_loads_back_with_same_outputs(store, tmp_path):
    import mlflow.pytorch

    cfg = make_cfg(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    x = torch.randn(4, 3)
    with job_run(cfg, stage="train") as tracker:
        start = time.monotonic()
        tracker.log_model(model)
        elapsed = time.monotonic() - start
        run_id = tracker.run_id
    assert tracker.failures == 0
    assert elapsed < 20, f"log_model took {elapsed:.1f} s (environment inference?)"
    loaded = mlflow.pytorch.load_model(f"runs:/{run_id}/model")
    torch.testing.assert_close(loaded(x), model(x))
    # Filed under our experiment and store, not MLflow's default ./mlruns.
    models = client_for(cfg).search_logged_models(
        experiment_ids=[init_store(cfg)], filter_string="name = 'model'"
    )
    assert [m.source_run_id for m in models] == [run_id]
    assert models[0].artifact_location.startswith((tmp_path / "results").as_uri())


def test_log_artifact_of_missing_file_raises(store, tmp_path):
    cfg = make_cfg(tmp_path)
    missing = tmp_path / "nope.png"
    with (
        pytest.raises(FileNotFoundError, match=r"nope\.png: artifact to log does not exist"),
        job_run(cfg, stage="evaluate") as tracker,
    ):
        tracker.log_artifact(missing)


def test_caller_errors_propagate_mid_run(store, tmp_path):
    from mlflow.exceptions import MlflowException

    cfg = make_cfg(tmp_path)
    with pytest.raises(MlflowException), job_run(cfg, stage="train") as tracker:
        tracker.log_params({"seed": 5})  # logged as 0 from the config: changing it is a bug
    assert client_for(cfg).get_run(tracker.run_id).info.status == "FAILED"


def test_store_outage_mid_run_keeps_metrics_and_goes_on(monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker = Tracker(f"http://127.0.0.1:{_closed_port()}", "0" * 32)
    start = time.monotonic()
    tracker.log_metrics({"train_loss": 0.5}, step=7)  # handed to the sender, not sent here
    handed_over = time.monotonic() - start
    with caplog.at_level("WARNING", logger="cosmocub.tracking.tracker"):
        tracker.set_tags({"a": "b"})
    unsent = tracker.close(timeout_s=5)
    assert handed_over < 0.05
    assert [(m.key, m.value, m.step) for m in unsent] == [("train_loss", 0.5, 7)]
    assert tracker.failures >= 2  # set_tags, and at least the sender's last try
    assert "MLflow set_tags failed for run 0000" in caplog.text


def test_unpicklable_model_warns_instead_of_failing_the_job(store, tmp_path, caplog):
    import threading

    cfg = make_cfg(tmp_path)
    model = torch.nn.Linear(2, 2)
    model.lock = threading.Lock()  # cannot be pickled
    with (
        caplog.at_level("WARNING", logger="cosmocub.tracking.tracker"),
        job_run(cfg, stage="train") as t,
    ):
        t.log_model(model)
    assert t.failures == 1
    assert "MLflow log_model failed" in caplog.text
    assert client_for(cfg).get_run(t.run_id).info.status == "FINISHED"


def test_system_metrics_are_logged(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    cfg = make_cfg(tmp_path, system_metrics=True)
    with job_run(cfg, stage="train") as tracker:
        time.sleep(1.5)
    metrics = client_for(cfg).get_run(tracker.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics
    assert 0 <= metrics["system/cpu_utilization_percentage"] <= 100


def _init_in_child(results: str, queue) -> None:
    cfg = load_config(None, overrides={"results": results})
    queue.put(init_store(cfg))


def test_concurrent_init_of_a_new_store_is_safe(tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_init_in_child, args=(str(tmp_path / "results"), queue))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    ids = {queue.get(timeout=1) for _ in procs}
    assert len(ids) == 1


def test_unwritable_results_fails_at_start(tmp_path):
    (tmp_path / "results").write_text("a file where the results folder should be")
    cfg = make_cfg(tmp_path)
    body_ran = False
    with pytest.raises(TrackingUnavailable) as info, job_run(cfg, stage="train"):
        body_ran = True
    assert not body_ran
    message = str(info.value)
    assert "\n" not in message
    assert f"sqlite:///{tmp_path}/results/mlflow.db" in message
    assert "tracking.enabled: false" in message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_unreachable_server_fails_at_start_within_seconds(tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    cfg = make_cfg(tmp_path, uri=uri)
    body_ran = False
    start = time.monotonic()
    with pytest.raises(TrackingUnavailable) as info, job_run(cfg, stage="train"):
        body_ran = True
    elapsed = time.monotonic() - start
    assert not body_ran
    assert elapsed < 10, f"took {elapsed:.1f} s to notice the server is down"
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"<defaults>: key 'tracking.uri': MLflow store {uri} is unavailable")
    # The short probe settings do not leak into the rest of the process.
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_a_gone_server_the_workflow_started_is_named_by_its_key(tmp_path):
    cfg = make_cfg(tmp_path, server={"start": True, "port": _closed_port()})
    with pytest.raises(TrackingUnavailable) as info, job_run(cfg, stage="train"):
        pass
    assert str(info.value).startswith("<defaults>: key 'tracking.server.start': MLflow store")
    assert "results/logs/mlflow-server.log" in str(info.value)


def test_cli_tracking_start_and_end(store, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"results: {tmp_path / 'results'}\ntracking: {{system_metrics: false}}\n")
    assert cli_main(["tracking", "start", "--config", str(config), "--name", "cli"]) == 0
    run_id = capsys.readouterr().out.strip()
    assert len(run_id) == 32
    args = ["tracking", "end", "--config", str(config), "--run-id", run_id, "--status", "FAILED"]
    assert cli_main(args) == 0
    run = client_for(load_config(config)).get_run(run_id)
    assert (run.info.status, run.info.run_name) == ("FAILED", "cli")


def test_cli_tracking_sync_delivers_what_a_run_kept_into_that_run(store, tmp_path, capsys):
    """A run whose store was away at its end left a record: its unsent metric, its status and
    its metrics.jsonl; `cosmocub tracking sync` puts them into the same run."""
    from mlflow.entities import Metric

    from cosmocub.tracking.pending import write_run_update

    config = tmp_path / "c.yaml"
    config.write_text(f"results: {tmp_path / 'results'}\ntracking: {{system_metrics: false}}\n")
    cfg = load_config(config)
    client = client_for(cfg)
    run_id = client.create_run(init_store(cfg)).info.run_id
    client.log_metric(run_id, "val_loss", 0.9, step=2)  # epoch 0 reached the store
    epochs = tmp_path / "metrics.jsonl"
    epochs.write_text(
        '{"epoch": 0, "step": 2, "val_loss": 0.9}\n{"epoch": 1, "step": 4, "val_loss": 0.7}\n'
    )
    write_run_update(
        cfg,
        run_id,
        metrics=[Metric("train_loss_step", 0.8, 1, 3)],
        artifacts=[],
        status="FINISHED",
        epochs_file=epochs,
    )
    assert cli_main(["tracking", "sync", "--config", str(config)]) == 0
    assert "delivered 1 pending record(s)" in capsys.readouterr().out
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "val_loss"))
    assert history == [(2, 0.9), (4, 0.7)]  # epoch 1 replayed, epoch 0 not twice
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss_step")] == [
        (3, 0.8)
    ]
    assert not list((tmp_path / "results" / "mlflow-pending").glob("*"))


def test_the_next_workflow_ends_the_runs_of_dead_processes_killed(store, tmp_path):
    """A job SIGKILLed (no `finally`) leaves its run RUNNING; the next workflow on this host
    ends it KILLED, and leaves a run whose process lives alone."""
    from cosmocub.tracking.reconcile import PID_TAG

    cfg = make_cfg(tmp_path)
    client = client_for(cfg)
    experiment_id = init_store(cfg)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    dead = client.create_run(experiment_id, tags={"host": host, PID_TAG: str(gone.pid)})
    live = client.create_run(experiment_id, tags={"host": host, PID_TAG: str(os.getpid())})
    elsewhere = client.create_run(experiment_id, tags={"host": "other", PID_TAG: str(gone.pid)})
    parent = start_workflow_run(cfg, owned=True)
    status = {r: client.get_run(r).info.status for r in (dead.info.run_id, live.info.run_id)}
    assert status == {dead.info.run_id: "KILLED", live.info.run_id: "RUNNING"}
    assert client.get_run(elsewhere.info.run_id).info.status == "RUNNING"  # its host's to end
    assert client.get_run(parent).data.tags[PID_TAG] == str(os.getpid())


def test_experiment_declares_model_training(store, tmp_path):
    """MLflow 3's UI opens experiments in its GenAI view unless told otherwise."""
    cfg = make_cfg(tmp_path)
    experiment_id = init_store(cfg)
    tags = client_for(cfg).get_experiment(experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_deferred_simulate_run_imports_no_mlflow_and_is_logged_later(store, tmp_path):
    """Inside a workflow a simulate job writes its run to a file (no MLflow import, ~3.5 s less
    per job); the next store opener logs it with the job's own times, metrics and parent."""
    cfg = make_cfg(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**cfg.values, "results": str(tmp_path / "results")}))
    parent = start_workflow_run(cfg)
    env = {**os.environ, PARENT_RUN_ENV: parent, "COSMOCUB_RULE": "simulate"}
    env["COSMOCUB_WILDCARDS"] = "seed=7"
    probe = (
        "import sys; from cosmocub.cli import main; "
        "rc = main(['simulate', sys.argv[1], '--size', '16', '--seed', '7',"
        " '--config', sys.argv[2]]); "
        "assert 'mlflow' not in sys.modules, 'mlflow imported'; sys.exit(rc)"
    )
    out = tmp_path / "u.hdf5"
    t0 = int(time.time() * 1000)
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(out), str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    t1 = int(time.time() * 1000)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = (tmp_path / "results" / "mlflow-pending").glob("*.json")
    client = client_for(cfg)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert len(client.search_runs([experiment.experiment_id])) == 1  # only the parent so far

    end_workflow_run(cfg, parent, "FINISHED")  # the workflow's end flushes what is left
    assert not record.exists()
    runs = client.search_runs([experiment.experiment_id], "tags.rule = 'simulate'")
    (run,) = runs
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.info.run_name == "simulate[seed=7]" and run.info.status == "FINISHED"
    assert t0 <= run.info.start_time <= run.info.end_time <= t1  # the job's times, not the flush's
    assert run.data.params["seed"] == "7" and run.data.params["train.epochs"] == "36"
    from cosmocub.data.universe import read_universe

    counts, _ = read_universe(out)
    m = run.data.metrics
    assert m["std_z0"] == pytest.approx(float(counts[..., 0].std()), rel=1e-6)
    assert m["max_z3"] == float(counts[..., 3].max())
    assert m["empty_fraction_z0.5"] == pytest.approx(float((counts[..., 1] == 0).mean()))
    assert 0 < m["wall_time_s"] < (t1 - t0) / 1000


def test_pending_runs_survive_a_store_outage(store, tmp_path, monkeypatch):
    from cosmocub.tracking.pending import RecordingTracker, flush_pending, write_record

    cfg = make_cfg(tmp_path)
    init_store(cfg)
    recorder = RecordingTracker()
    recorder.log_metrics({"a": 1.0})
    path = write_record(
        cfg, recorder, tags={"rule": "x"}, run_name="x", params=None, start_ms=1, status="FINISHED"
    )

    class Down:
        def get_experiment_by_name(self, name):
            raise OSError("store down")

    assert flush_pending(cfg, Down()) == 0
    assert path.exists()  # put back for a later flush
    assert flush_pending(cfg, client_for(cfg)) == 1 and not path.exists()
    assert flush_pending(cfg, client_for(cfg)) == 0  # never twice


def test_a_model_the_store_did_not_take_is_delivered_into_its_run(store, tmp_path, monkeypatch):
    """log_model with the store down keeps the model (not only a warning); the run's pending
    record carries it, and the flush logs it into that same run, loadable as if logged live."""
    import mlflow
    import mlflow.pytorch

    from cosmocub.tracking.pending import flush_pending, pending_dir, write_run_update

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as a job's, not MLflow's 7
    cfg = make_cfg(tmp_path)
    init_store(cfg)
    client = client_for(cfg)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    run_id = client.create_run(experiment.experiment_id).info.run_id
    down = Tracker(f"http://127.0.0.1:{_closed_port()}", run_id)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    down.log_model(model, name="model")
    assert [name for _, name in down.unsent_models] == ["model"] and down.failures == 1
    write_run_update(
        cfg,
        run_id,
        metrics=[],
        artifacts=[],
        status="FINISHED",
        epochs_file=None,
        models=down.unsent_models,
    )
    assert len(list(pending_dir(cfg).glob("*-model.pt"))) == 1

    assert flush_pending(cfg, client) == 1
    assert list(pending_dir(cfg).iterdir()) == []  # the record and its model copy, both gone
    assert client.get_run(run_id).info.status == "FINISHED"
    mlflow.set_tracking_uri(tracking_uri(cfg))
    loaded = mlflow.pytorch.load_model(f"runs:/{run_id}/model")
    x = torch.randn(5, 3)
    torch.testing.assert_close(loaded(x), model(x))


# ---------------------------------------------------------------------------------------------
# A real tracking server


def _wait_for_health(proc: subprocess.Popen, url: str, root: object) -> None:
    """Until the server answers /health (a failure naming its log if it exits or is slow)."""
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}: see {root}/server.log")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"mlflow server did not answer /health in 120 s: see {root}/server.log")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _closed_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [
        *(sys.executable, "-m", "mlflow", "server"),
        *("--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"),
        *("--artifacts-destination", str(root / "artifacts")),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    with open(root / "server.log", "w") as log:
        # Own session, so teardown can stop the server and the workers it forks, and nothing else.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_for_health(proc, url, root)
            yield url, root
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow
def test_runs_logged_to_a_real_server(tmp_path, monkeypatch, mlflow_server):
    url, root = mlflow_server
    cfg = make_cfg(tmp_path, uri=url, experiment="server-test")
    assert artifact_location(cfg) is None  # the server decides (proxied artifacts)
    parent = start_workflow_run(cfg)
    monkeypatch.setenv("COSMOCUB_PARENT_RUN_ID", parent)
    model = torch.nn.Linear(2, 1)
    with job_run(cfg, stage="evaluate") as tracker:
        tracker.log_metrics({"test_mae": 0.12}, step=1)
        tracker.log_model(model)
        child = tracker.run_id
    end_workflow_run(cfg, parent, "FINISHED")
    assert tracker.failures == 0

    client = MlflowClient(tracking_uri=url)
    run = client.get_run(child)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.metrics == {"test_mae": 0.12}
    assert run.data.params == expected_params(cfg)
    assert client.get_run(parent).info.status == "FINISHED"
    assert "config.yaml" in {a.path for a in client.list_artifacts(child)}
    # Artifacts went through the server into its --artifacts-destination, not under tmp_path.
    assert list(root.joinpath("artifacts").rglob("config.yaml"))
    assert not (tmp_path / "results").exists()
    import mlflow.pytorch

    x = torch.randn(3, 2)
    torch.testing.assert_close(mlflow.pytorch.load_model(f"runs:/{child}/model")(x), model(x))


def test_a_failed_start_stops_the_server_it_started(tmp_path, monkeypatch) -> None:
    """Snakemake calls no onerror after a failed onstart: start_tracking itself stops the server
    it started when the parent run cannot be opened (seen: a server too loaded to answer)."""
    import cosmocub.tracking.workflow_run as workflow_run

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        yaml.safe_dump({"results": str(tmp_path / "r"), "tracking": {"server": {"start": True}}})
    )
    cfg = load_config(cfg_path)
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped: list[int] = []
    monkeypatch.setattr(workflow_run, "start_server", lambda cfg: server)
    monkeypatch.setattr(workflow_run, "stop_server", lambda pid: stopped.append(pid))

    def unavailable(cfg, **kwargs):
        raise RuntimeError("store unavailable")

    monkeypatch.setattr(workflow_run, "start_workflow_run", unavailable)
    try:
        with pytest.raises(RuntimeError, match="store unavailable"):
            workflow_run.start_tracking(cfg, ["all"])
        assert stopped == [server.pid]
        assert workflow_run.SERVER_PID_ENV not in os.environ
    finally:
        server.kill()
        server.wait()
