"""A real `mlflow server` killed (SIGKILL) under a 2-rank gloo training and started again on the
same port, and a training killed and resumed: training does not slow down, and in the end the
one MLflow run of each training holds every epoch of metrics.jsonl and is not left RUNNING."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from shard_fixtures import make_random_shards
from test_train import TINY  # the plain tiny recipe the training tests share

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.train.main import MLFLOW_RUN_FILE

# A rank that stops at the steps named in its gates: at {"step": s, "flag": f} rank 0 writes
# f.waiting and waits for f.go (the other rank waits in the next collective); at
# {"step": s, "die": true} rank 0 kills itself as the OOM killer would.
GATED_RANK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from cosmocub.config import load_config
    from cosmocub.train.main import train
    cfg, shards, run, gates = sys.argv[1:5]
    gates = {g["step"]: g for g in json.loads(gates)}

    def hook(step, model):
        gate = gates.get(step)
        if gate is None or os.environ["RANK"] != "0":
            return
        if gate.get("die"):
            os.kill(os.getpid(), signal.SIGKILL)
        open(gate["flag"] + ".waiting", "w").close()
        while not os.path.exists(gate["flag"] + ".go"):
            time.sleep(0.05)

    train(load_config(cfg), shards_dir=shards, run_dir=run, on_step_end=hook)
    """
)
STEPS_PER_EPOCH = 2  # 16 samples, 4 a rank, 2 ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` on 127.0.0.1:port, in a session of its own (killed as a group)."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.proc = root, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        cmd = [
            *(sys.executable, "-m", "mlflow", "server"),
            *("--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}"),
            *("--artifacts-destination", str(self.root / "artifacts")),
            *("--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"),
        ]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.root / "server.log", "a") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 90
        while not self.healthy():
            assert self.proc.poll() is None, f"mlflow server exited: {self.root}/server.log"
            assert time.monotonic() < deadline, f"no /health in 90 s: {self.root}/server.log"
            time.sleep(0.3)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server and everything it forked, as a crash of its host would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc is not None:
            # The workers it forked share its group; a dead leader's group may still hold them.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # One server for the module (a start costs seconds); the outage test leaves it started again.
    root = tmp_path_factory.mktemp("server")
    srv = Server(root, free_port())
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_shards(
        tmp_path_factory.mktemp("shards"), counts={"train": 16, "val": 8}, size=8
    )


def config(tmp_path: Path, url: str, epochs: int) -> Path:
    """The tiny 2-rank recipe logging to `url`, in an experiment named after the test's folder."""
    values = json.loads(json.dumps(TINY))
    values["results"] = str(tmp_path / "results")
    values["train"].update(
        epochs=epochs, log_every_steps=1, checkpoint_every_steps=2, ranks_per_node=2
    )
    values["tracking"] = {"uri": url, "experiment": tmp_path.name, "system_metrics": False}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def start_training(tmp_path: Path, cfg: Path, shards: Path, gates: list[dict]):
    script = tmp_path / "rank.py"
    script.write_text(GATED_RANK)
    argv = torchrun_argv(2, str(script), str(cfg), str(shards), str(tmp_path / "run"))
    return multirank.start_ranks([*argv, json.dumps(gates)], cwd=tmp_path)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"training ended before {path.name}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"{path.name}: not within {timeout} s"
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        multirank.kill_tree(proc)
        pytest.fail(f"training did not end in {timeout} s")
    return proc.returncode, err


def assert_run_holds_metrics_jsonl(url: str, run_dir: Path, *, once: bool) -> str:
    """The experiment's one run is the run folder's, FINISHED, and every metrics.jsonl value is
    its latest at its epoch's step (`once`: the only one there); returns its id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name(run_dir.parent.name)
    runs = client.search_runs([experiment.experiment_id])
    run_id = json.loads((run_dir / MLFLOW_RUN_FILE).read_text())["run_id"]
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("train_loss", "val_loss", "lr", "samples_per_s", "elapsed_s"):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
        latest = {m.step: m.value for m in history}
        assert latest == {r["step"]: pytest.approx(r[key], rel=1e-12) for r in records}, key
        if once:
            assert len(history) == len(records), key
    # The per-step loss apart from the epoch's mean: one value a step, every step (`once`; a
    # SIGKILLed job loses the per-step values it had not sent: they are in no file).
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train_loss_step"))
    if once:
        assert steps == list(range(1, records[-1]["step"] + 1))
    return run_id


@pytest.mark.slow
def test_a_server_killed_mid_training_costs_no_time_and_loses_no_epoch(
    tmp_path: Path, shards: Path, server: Server
) -> None:
    epochs, kill_at, back_at = 12, 3, 8  # the server is down for epochs 3-7
    cfg = config(tmp_path, server.url, epochs)
    gates = [
        {"step": kill_at * STEPS_PER_EPOCH + 1, "flag": str(tmp_path / "kill")},
        {"step": back_at * STEPS_PER_EPOCH + 1, "flag": str(tmp_path / "back")},
    ]
    proc = start_training(tmp_path, cfg, shards, gates)
    try:
        wait_for(tmp_path / "kill.waiting", proc, 120)
        server.kill()
        assert not server.healthy()
        (tmp_path / "kill.go").touch()
        wait_for(tmp_path / "back.waiting", proc, 60)
        server.start()  # the same port, the same database
        (tmp_path / "back.go").touch()
        rc, err = finish(proc, 120)
    finally:
        multirank.kill_tree(proc)
    assert rc == 0, err[-3000:]
    records = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    assert [r["epoch"] for r in records] == list(range(epochs))
    took = [b["elapsed_s"] - a["elapsed_s"] for a, b in itertools.pairwise(records)]
    before = max(took[1 : kill_at - 1])  # took[i]: epoch i + 1; epoch 0 warms up
    down = took[kill_at : back_at - 1]  # epochs kill_at + 1 … back_at - 1: no gate inside
    assert max(down) <= before + 2.0, (before, down)
    assert "sends in a row to run" in err  # the sender saw the outage and said so, once
    assert err.count("sends in a row to run") == 1
    assert_run_holds_metrics_jsonl(server.url, tmp_path / "run", once=True)
    assert not list((tmp_path / "results" / "mlflow-pending").glob("*.json"))
    # The artifacts and the model, logged at the end through the store that came back.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.url)
    run_id = json.loads((tmp_path / "run" / MLFLOW_RUN_FILE).read_text())["run_id"]
    assert {a.path for a in client.list_artifacts(run_id)} >= {"metrics.jsonl", "config.yaml"}


# Two 2-rank launches (30 s at a load of 2): on request, beside the outage test in the suite.
@pytest.mark.long
def test_a_killed_and_resumed_training_is_one_mlflow_run(
    tmp_path: Path, shards: Path, server: Server
) -> None:
    if not server.healthy():  # the outage test failed between its kill and its restart
        server.start()
    cfg = config(tmp_path, server.url, epochs=5)
    # Rank 0 is SIGKILLed in epoch 3 (no `finally` runs): its run stays RUNNING until resumed.
    proc = start_training(tmp_path, cfg, shards, [{"step": 7, "die": True}])
    try:
        rc, _ = finish(proc, 120)
    finally:
        multirank.kill_tree(proc)
    assert rc != 0
    proc = start_training(tmp_path, cfg, shards, [])
    try:
        rc, err = finish(proc, 120)
    finally:
        multirank.kill_tree(proc)
    assert rc == 0, err[-3000:]
    from mlflow.tracking import MlflowClient

    # Epoch 2 ran again after the step-6 checkpoint: its timings' latest values are the rerun's.
    run_id = assert_run_holds_metrics_jsonl(server.url, tmp_path / "run", once=False)
    steps = {m.step for m in MlflowClient(server.url).get_metric_history(run_id, "train_loss_step")}
    assert steps >= {1, 2, 7, 8, 9, 10}  # sent before the kill, and the resumed job's
    assert (
        MlflowClient(tracking_uri=server.url).get_run(run_id).data.tags["cosmocub.resumes"] == "1"
    )
