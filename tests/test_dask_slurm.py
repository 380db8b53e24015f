"""Dask workers as Slurm jobs (preprocess.dask_slurm_workers) without a Slurm: the config's
checks, and the start → wait → cancel path against stand-in sbatch/squeue/scancel/scontrol that
accept jobs and never run them (tests/cluster/test_slurm_nodes_dask.py runs real ones)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import yaml

from cosmocub.config import ConfigError, load_config
from cosmocub.config.training import PreprocessResources
from cosmocub.data.dask_slurm import slurm_workers
from cosmocub.data.splits import PreprocessError
from cosmocub.train.checkpoint import resume_hash


def _config(tmp_path: Path, preprocess: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"preprocess": preprocess}))
    return path


def test_both_dask_keys_are_refused_in_one_line(tmp_path) -> None:
    path = _config(tmp_path, {"dask_slurm_workers": 2, "dask_scheduler": "tcp://h:8786"})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "\n" not in message
    assert "'preprocess.dask_slurm_workers' (2)" in message
    assert "'preprocess.dask_scheduler' ('tcp://h:8786')" in message


def test_the_keys_are_checked_and_operational(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"dask_slurm_workers.*0 is less than the minimum of 1"):
        load_config(_config(tmp_path, {"dask_slurm_workers": 0}))
    off = load_config(_config(tmp_path, {}))
    assert off.preprocess.dask_slurm_workers is None
    assert off.preprocess.dask_slurm_wait_s == 600
    on = load_config(_config(tmp_path, {"dask_slurm_workers": 3, "dask_slurm_wait_s": 30}))
    assert on.preprocess.dask_slurm_workers == 3
    # Where the work ran does not change the data: a run may resume with the key changed.
    assert resume_hash(on) == resume_hash(off)
    assert on.hash != off.hash


def test_off_yields_the_settings_and_starts_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch or scontrol to find
    settings = load_config(None).preprocess
    resources = load_config(None).cluster.preprocess
    with slurm_workers(settings, resources, tmp_path / "logs") as got:
        assert got is settings
    assert not (tmp_path / "logs").exists()


# Stand-ins for Slurm's commands: jobs are accepted (and their scripts kept), listed as pending,
# cancelled by name (the calls kept), never run.
FAKE = {
    "scontrol": 'echo "SlurmctldHost[0]        = fakectl(127.0.0.1)"',
    # --test-only: checks the script from stdin (refused with $FAKE_REFUSE's message, if set);
    # else submits $1, the job's id its pid.
    "sbatch": 'if [ "$1" = --test-only ]; then cat > "$FAKE_SLURM/tested"\n'
    '  [ -z "$FAKE_REFUSE" ] || { echo "$FAKE_REFUSE" >&2; exit 1; }; exit 0; fi\n'
    'cp "$1" "$FAKE_SLURM/job$$.sh"; echo "Submitted batch job $$"',
    "squeue": 'for f in "$FAKE_SLURM"/job*.sh; do echo "PENDING (Resources)"; done',
    "scancel": 'echo "$@" >> "$FAKE_SLURM/scancel"',
}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir(), state.mkdir()
    for name, body in FAKE.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "part")
    monkeypatch.setenv("SLURM_JOB_ACCOUNT", "acct")
    return state


def _failed_start(tmp_path: Path, wait_s: float) -> tuple[str, float]:
    """2 workers of 3 threads, 1234 MB and 90 min that do not start: the error, and the seconds
    slurm_workers took to raise it."""
    import dataclasses

    settings = dataclasses.replace(
        load_config(None).preprocess, dask_slurm_workers=2, dask_slurm_wait_s=wait_s
    )
    resources = PreprocessResources(
        universes_per_job=8, files_per_job=6400, threads=3, mem_mb=1234, runtime=90
    )
    t0 = time.perf_counter()
    with (
        pytest.raises(PreprocessError) as caught,
        slurm_workers(settings, resources, tmp_path / "logs"),
    ):
        pytest.fail("the block ran without workers")
    return str(caught.value), time.perf_counter() - t0


def test_workers_that_never_come_fail_in_one_line_and_are_cancelled(fake_slurm, tmp_path) -> None:
    message, seconds = _failed_start(tmp_path, wait_s=2)
    assert seconds < 30
    assert "\n" not in message
    assert message.startswith("key 'preprocess.dask_slurm_workers': 0 of 2 Dask workers")
    assert "within 2 s (preprocess.dask_slurm_wait_s)" in message
    assert "(cosmocub-dask-77): 2 PENDING (Resources)" in message
    assert f"worker logs in {tmp_path / 'logs'}" in message
    # Two jobs of one worker each, sized as a preprocessing job, in this job's partition and
    # account, their scheduler on the address that routes to the controller.
    scripts = sorted(fake_slurm.glob("job*.sh"))
    assert len(scripts) == 2
    script = scripts[0].read_text()
    for line in (
        "#SBATCH -J cosmocub-dask-77",
        "#SBATCH -p part",
        "#SBATCH -A acct",
        "#SBATCH -n 1",
        "#SBATCH --cpus-per-task=3",
        "#SBATCH --mem=1234M",
        "#SBATCH -t 01:30:00",
        f"#SBATCH -o {tmp_path / 'logs'}/cosmocub-dask-77-%J.out",
    ):
        assert line in script.splitlines(), line
    assert "--nthreads 3" in script and "tcp://127.0.0.1:" in script
    assert "--death-timeout 60" in script
    # Cancelled by name first, then each job by dask-jobqueue as it closed.
    calls = (fake_slurm / "scancel").read_text().splitlines()
    assert calls[0] == f"--name cosmocub-dask-77 --user {os.environ.get('USER') or 'root'}"
    assert sorted(calls[1:]) == sorted(p.stem.removeprefix("job") for p in scripts)


def test_without_a_slurm_controller(fake_slurm, tmp_path) -> None:
    import dataclasses

    (tmp_path / "bin" / "scontrol").write_text("#!/bin/bash\necho 'no cluster' >&2; exit 1\n")
    settings = dataclasses.replace(load_config(None).preprocess, dask_slurm_workers=1)
    resources = load_config(None).cluster.preprocess
    with (
        pytest.raises(PreprocessError, match=r"names no Slurm controller \(no cluster\)"),
        slurm_workers(settings, resources, tmp_path / "logs"),
    ):
        pytest.fail("the block ran without workers")
    assert not list(fake_slurm.glob("job*.sh"))


def test_a_cancelled_command_cancels_its_workers(fake_slurm, tmp_path) -> None:
    """SIGTERM (scancel of the group job) while it waits for its workers: the jobs are
    cancelled by name before the process ends."""
    import signal
    import subprocess
    import sys

    program = f"""
import dataclasses
from pathlib import Path
from cosmocub.config import load_config
from cosmocub.data.dask_slurm import slurm_workers
cfg = load_config(None)
settings = dataclasses.replace(cfg.preprocess, dask_slurm_workers=2, dask_slurm_wait_s=120)
with slurm_workers(settings, cfg.cluster.preprocess, Path({str(tmp_path / "logs")!r})):
    raise AssertionError("the block ran without workers")
"""
    proc = subprocess.Popen([sys.executable, "-c", program], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(fake_slurm.glob("job*.sh"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    calls = (fake_slurm / "scancel").read_text().splitlines()
    assert calls[0].startswith("--name cosmocub-dask-77 "), calls


def test_worker_jobs_that_slurm_refuses_fail_at_once(fake_slurm, tmp_path, monkeypatch) -> None:
    refusal = "sbatch: error: Batch job submission failed: Memory required by task is not available"
    monkeypatch.setenv("FAKE_REFUSE", f"sbatch: some warning\n{refusal}")
    message, seconds = _failed_start(tmp_path, wait_s=600)
    assert seconds < 30  # not the 600 s wait
    assert message == (
        "key 'preprocess.dask_slurm_workers': Slurm refuses the worker jobs (cluster.preprocess: "
        f"3 threads, 1234 MB, 90 min): {refusal}"
    )
    assert "#SBATCH --mem=1234M" in (fake_slurm / "tested").read_text()
    assert not list(fake_slurm.glob("job*.sh"))
