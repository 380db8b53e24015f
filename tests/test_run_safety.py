"""A distributed run that cannot run away: nothing outlives the launcher or a timed-out test, one
training per run folder, and a start-up that agrees on what to resume before pruning."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml
from shard_fixtures import make_random_shards
from test_train import TINY  # the plain tiny recipe the training tests share

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.models.model_factory import load_model_file
from cosmocub.train.main import train
from cosmocub.train.run_lock import LOCK_FILE, RunFolderBusyError, acquire_run_lock


def tiny_yaml(path: Path, **train_changes) -> Path:
    values = json.loads(json.dumps(TINY))
    values["train"].update(train_changes)
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_shards(
        tmp_path_factory.mktemp("shards"), counts={"train": 16, "val": 8}, size=8
    )


def alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie has ended: only its parent's wait is missing)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


# --- the multi-rank helper ----------------------------------------------------------------------

HANGING_RANK = textwrap.dedent(
    """
    import os, subprocess, sys, time
    # A grandchild in a session of its own: only a walk of the tree finds it.
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    folder = sys.argv[1]
    for pid in (os.getpid(), os.getppid(), sleeper.pid):
        open(os.path.join(folder, f"{os.environ['RANK']}.{pid}"), "w").close()
    time.sleep(600)
    """
)


@pytest.mark.slow
def test_multirank_timeout_leaves_no_process_behind(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANGING_RANK)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    with pytest.raises(subprocess.TimeoutExpired):
        # 10 s: torchrun (which imports torch) and both ranks (which do not) are up within ~3 s
        # on a quiet machine; what is tested is the tree after the timeout, not its length.
        multirank.run_ranks(torchrun_argv(2, str(script), str(pids_dir)), timeout=10)
    names = [p.name for p in pids_dir.iterdir()]
    assert sorted({n.split(".")[0] for n in names}) == ["0", "1"], names  # both ranks ran
    pids = sorted({int(n.split(".")[1]) for n in names})
    assert len(pids) == 5  # 2 ranks, their torchrun, 2 sleepers
    wait_for(lambda: not alive(pids), 5, f"processes {alive(pids)} outlived the timeout")


# --- the launcher -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "term"])
def test_a_stopped_launcher_leaves_no_rank(shards: Path, tmp_path: Path, signum: int) -> None:
    """kill -9 (OOM killer, a killed Snakemake) or SIGTERM (scancel, Snakemake's stop) of
    `cosmocub launch` while its ranks train: within 10 s no torchrun and no rank is left, and
    the run folder's lock went with them. SIGTERM's log ends with the launcher's own line."""
    cfg = tiny_yaml(tmp_path / "cfg.yaml", epochs=1000, checkpoint_every_steps=2, ranks_per_node=2)
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "cosmocub.cli", "launch", "--"]  # 2 ranks: the config's
    argv += ["train", "--config", str(cfg), "--shards", str(shards), "--out", str(run)]
    launcher = multirank.start_ranks(argv, cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        # Training: a checkpoint is written, so torchrun and both ranks are at work.
        wait_for(lambda: list(run.glob("checkpoints/*/step_????????.pt")), 120, "no checkpoint")
        family = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
        assert len(family) >= 3, family  # torchrun + 2 ranks
        os.kill(launcher.pid, signum)
        wait_for(lambda: not alive(family), 10, f"{alive(family)} outlived the launcher")
        _, err = launcher.communicate(timeout=60)
    finally:
        multirank.kill_tree(launcher)
    if signum == signal.SIGTERM:
        assert launcher.returncode == 128 + signal.SIGTERM, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("cosmocub launch: stopped by SIGTERM"), err[-3000:]
        assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    acquire_run_lock(run).release()  # the dead holder's lock went with it


# --- one training per run folder ----------------------------------------------------------------

PAUSED_RANK = textwrap.dedent(
    """
    import os, sys, time
    from cosmocub.config import load_config
    from cosmocub.train.main import train
    cfg, shards, run, flag = sys.argv[1:5]

    def hook(step, model):
        if step == 1:  # hold the folder, mid-training, until the test says go
            open(flag + ".waiting", "w").close()
            while not os.path.exists(flag + ".go"):
                time.sleep(0.05)

    train(load_config(cfg), shards_dir=shards, run_dir=run, on_step_end=hook)
    """
)


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.mark.slow
def test_second_training_on_a_held_folder_is_refused(shards: Path, tmp_path: Path) -> None:
    cfg = tiny_yaml(tmp_path / "cfg.yaml", epochs=2, checkpoint_every_steps=1)
    script = tmp_path / "paused.py"
    script.write_text(PAUSED_RANK)
    run, flag = tmp_path / "run", tmp_path / "flag"
    first = multirank.start_ranks(
        [sys.executable, str(script), str(cfg), str(shards), str(run), str(flag)]
    )
    try:
        wait_for(lambda: Path(f"{flag}.waiting").exists() or first.poll() is not None, 120, "A")
        assert first.poll() is None, first.communicate()[1][-3000:]
        before = tree(run)
        train_args = ["train", "--config", str(cfg), "--shards", str(shards), "--out", str(run)]
        second = subprocess.run(
            [sys.executable, "-m", "cosmocub.cli", *train_args],
            capture_output=True,
            text=True,
            timeout=120,
            env=multirank.rank_env(),
        )
        assert second.returncode == 2, second.stderr[-3000:]
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith(f"cosmocub train: error: {run / LOCK_FILE}: run folder in use")
        assert f"host {socket.gethostname()} pid {first.pid} since " in line
        assert tree(run) == before  # nothing of the first was touched
        Path(f"{flag}.go").touch()
        _, err = first.communicate(timeout=120)
    finally:
        multirank.kill_tree(first)
    assert first.returncode == 0, err[-3000:]
    # The first finished as if alone: the weights of an undisturbed run, bit for bit.
    alone = tmp_path / "alone"
    from cosmocub.config import load_config

    train(load_config(cfg), shards_dir=shards, run_dir=alone)
    held, undisturbed = load_model_file(run / "model.pt"), load_model_file(alone / "model.pt")
    for (name, a), (_, b) in zip(
        held.state_dict().items(), undisturbed.state_dict().items(), strict=True
    ):
        assert a.equal(b), name


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from cosmocub.train.run_lock import "
            "acquire_run_lock; acquire_run_lock(sys.argv[1]); print('held', flush=True); "
            "time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusyError, match=rf"pid {holder.pid} since"):
            acquire_run_lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lock = acquire_run_lock(tmp_path)  # the kernel released the killed holder's lock
    assert f"pid {os.getpid()} " in (tmp_path / LOCK_FILE).read_text()
    lock.release()


# --- start-up: rank 0 decides, then prunes -------------------------------------------------------

STARTUP_RANKS = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch.distributed as dist
    from cosmocub.config import load_config
    from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
    from cosmocub.train.build import build_trainer
    from cosmocub.train.checkpoint import CheckpointManager
    from cosmocub.train.run_lock import RunFolderBusyError, hold_run_folder
    cfg_path, shards, root, held, trials = sys.argv[1:6]
    cfg = load_config(cfg_path)
    dims = build_parallel_dims()
    if not dims.is_main:  # only rank 0 may look at the folders: the others hear its decision

        def forbidden(self):
            raise AssertionError(f"rank {dims.rank} listed {self.folder.parent}")

        CheckpointManager.latest = CheckpointManager.other_folders = forbidden
    out = {"refused": None, "trials": []}
    try:  # the test holds this folder: every rank must hear so
        hold_run_folder(held, is_main=dims.is_main, world_size=dims.world_size)
    except RunFolderBusyError as err:
        out["refused"] = str(err)
    for trial in range(int(trials)):
        run = os.path.join(root, f"run{trial}")
        if dims.is_main:  # a dozen old config folders, 20 checkpoints each, oldest first
            for i in range(12):
                folder = os.path.join(run, "checkpoints", f"{i:012x}")
                os.makedirs(folder)
                for step in range(1, 21):
                    path = os.path.join(folder, f"step_{step:08d}.pt")
                    open(path, "wb").close()
                    os.utime(path, (1e9 + 100 * i + step,) * 2)
                with open(os.path.join(folder, "resume.json"), "w") as f:
                    json.dump({"seed": i}, f)
        dist.barrier()
        trainer, state, resumed = build_trainer(
            cfg, dims, shards_dir=Path(shards), run_dir=Path(run)
        )
        fresh = trainer.checkpoints.fresh_start
        dist.barrier()
        left = sorted(os.listdir(os.path.join(run, "checkpoints")))
        out["trials"].append(
            {"resumed": resumed and str(resumed), "previous": fresh and fresh.previous.name,
             "changed": fresh and list(fresh.changed), "left": left}
        )
    everyone = [None] * dims.world_size
    dist.all_gather_object(everyone, out)
    if dims.is_main:
        with open(os.path.join(root, "result.json"), "w") as f:
            json.dump(everyone, f)
    close_parallel_dims(dims)
    """
)


@pytest.mark.slow
def test_startup_with_four_ranks_and_a_dozen_old_folders(shards: Path, tmp_path: Path) -> None:
    cfg = tiny_yaml(tmp_path / "cfg.yaml", local_batch_size=2, keep_old_checkpoint_folders=1)
    script = tmp_path / "startup.py"
    script.write_text(STARTUP_RANKS)
    held = tmp_path / "held"
    lock = acquire_run_lock(held)
    trials = 6
    try:
        args = [str(script), str(cfg), str(shards), str(tmp_path), str(held), str(trials)]
        proc = multirank.run_ranks(torchrun_argv(4, *args), timeout=240)
    finally:
        lock.release()
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = json.loads((tmp_path / "result.json").read_text())
    assert len(ranks) == 4
    for rank in ranks:
        assert f"{held / LOCK_FILE}: run folder in use by another training (host " in (
            rank["refused"] or ""
        )
        assert len(rank["trials"]) == trials
        for trial in rank["trials"]:
            # Every rank: the same fresh start from the newest old folder, whose keys it names;
            # then only the newest old folder is left (keep_old_checkpoint_folders: 1).
            assert trial["resumed"] is None
            assert trial["previous"] == f"{11:012x}"
            assert trial["changed"] and any(c.startswith("seed: 11 → ") for c in trial["changed"])
            assert trial["left"] == [f"{11:012x}"]


SIGTERM_DURING_WRITE = """
import os, signal, sys
from pathlib import Path
from cosmocub.io import atomic_path, sigterm_deferred

final = Path(sys.argv[1])
with sigterm_deferred():
    with atomic_path(final) as tmp:
        tmp.write_text("half")
        os.kill(os.getpid(), signal.SIGTERM)  # a scancel lands mid-write
        tmp.write_text("whole")  # still running: the signal waits for the block's end
    Path(sys.argv[2]).write_text("after the rename, inside the block")
Path(sys.argv[2]).write_text("after the block: the SIGTERM did not arrive")
"""


def test_a_sigterm_during_a_guarded_write_waits_for_the_rename(tmp_path: Path) -> None:
    final, marker = tmp_path / "step.pt", tmp_path / "marker"
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_DURING_WRITE, str(final), str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Killed by the held SIGTERM as the block ended, with the file whole and no temporary.
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert final.read_text() == "whole"
    assert marker.read_text() == "after the rename, inside the block"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marker", "step.pt"]


SIGTERM_DURING_METRICS = """
import os, pathlib, signal, sys
from cosmocub.io import write_jsonl

write_text = pathlib.Path.write_text
def cancelled_mid_write(self, text):
    os.kill(os.getpid(), signal.SIGTERM)  # a scancel lands while metrics.jsonl is written
    return write_text(self, text)
pathlib.Path.write_text = cancelled_mid_write
write_jsonl(pathlib.Path(sys.argv[1]), [{"epoch": 0}, {"epoch": 1}])
pathlib.Path(sys.argv[1] + ".after").touch()  # not reached: the held SIGTERM ends it first
"""


def test_a_sigterm_while_metrics_are_written_leaves_them_whole(tmp_path: Path) -> None:
    # The race CI caught in tests/cluster/test_slurm.py: a cancel at an epoch's end left
    # .metrics.jsonl.tmp-<pid> in the run folder.
    final = tmp_path / "metrics.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_DURING_METRICS, str(final)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert final.read_text() == '{"epoch": 0}\n{"epoch": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
