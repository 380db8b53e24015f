"""Dask workers as Slurm jobs for one preprocessing command (preprocess.dask_slurm_workers):
dask-jobqueue's SLURMCluster, started before the work and its jobs cancelled when it ends."""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cosmocub.config import PreprocessConfig, PreprocessResources
from cosmocub.data.splits import PreprocessError
from cosmocub.io import signals_raise

KEY = "preprocess.dask_slurm_workers"
# A worker that loses its scheduler for this long exits, and so its job ends: the safety net
# should this command die by SIGKILL before it cancels them (dask-jobqueue's own default).
WORKER_DEATH_TIMEOUT_S = 60
CLOSE_TIMEOUT_S = 30


def controller_address() -> str:
    """slurmctld's address from this cluster's configuration (`SlurmctldHost[0]`: `name(addr)`,
    or `name`)."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        raise PreprocessError(
            f"key '{KEY}': scontrol is not installed here (the key starts its Dask workers as "
            f"Slurm jobs): run on a Slurm cluster, or set it to null"
        ) from None
    found = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)\s]+)\))?", shown.stdout, re.M)
    if shown.returncode != 0 or found is None:
        said = (shown.stderr.strip().splitlines() or ["no SlurmctldHost line"])[-1]
        raise PreprocessError(
            f"key '{KEY}': `scontrol show config` names no Slurm controller ({said}), so no "
            f"Dask workers can be started on Slurm; set it to null"
        )
    return found.group(2) or found.group(1)


def scheduler_host() -> str:
    """This host's address on the network that reaches slurmctld: the address that the worker
    jobs' nodes reach this host at (on the emulated nodes, the node's eth0)."""
    from distributed.utils import get_ip

    controller = controller_address()
    try:
        return get_ip(socket.gethostbyname(controller))
    except OSError as err:
        raise PreprocessError(
            f"key '{KEY}': no route to the Slurm controller {controller!r} ({err}), so no "
            f"address for the Dask scheduler"
        ) from None


def _walltime(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _job_name() -> str:
    """Unique to this command (a Slurm job's id, else host and pid), so that a cancel by name
    reaches its workers and no one else's."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"cosmocub-dask-{job}" if job else f"cosmocub-dask-{socket.gethostname()}-{os.getpid()}"


def _jobs_by_state(name: str) -> str:
    """`2 PENDING (Resources), 1 RUNNING (None)`: the worker jobs as squeue lists them."""
    listed = subprocess.run(
        ["squeue", "-h", "--name", name, "--user", getpass.getuser(), "-o", "%T (%r)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if listed.returncode != 0:
        return f"squeue failed: {(listed.stderr.strip().splitlines() or ['?'])[-1]}"
    counts = Counter(listed.stdout.splitlines())
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none listed"


def _cancel(name: str) -> None:
    """Cancel every job of ours named `name`: one call, fast enough to end before the SIGKILL
    that follows a scheduler's SIGTERM (Slurm's KillWait), whatever dask-jobqueue still knows."""
    subprocess.run(
        ["scancel", "--name", name, "--user", getpass.getuser()], capture_output=True, timeout=60
    )


def _check_submittable(script: str, resources: PreprocessResources) -> None:
    """`sbatch --test-only` on a worker's job script: a request that Slurm refuses (partition,
    account, memory, time) fails here at once; dask-jobqueue would only log sbatch's error and
    leave the wait to time out."""
    checked = subprocess.run(
        ["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=60
    )
    if checked.returncode != 0:
        said = (checked.stderr.strip().splitlines() or ["no message"])[-1]
        raise PreprocessError(
            f"key '{KEY}': Slurm refuses the worker jobs (cluster.preprocess: "
            f"{resources.threads} threads, {resources.mem_mb} MB, {resources.runtime} min): {said}"
        )


def _wait_for_workers(cluster: Any, n: int, wait_s: float, name: str, log_dir: Path) -> None:
    try:
        cluster.wait_for_workers(n, timeout=wait_s)
    except TimeoutError:
        came = len(cluster.scheduler_info.get("workers", {}))
        raise PreprocessError(
            f"key '{KEY}': {came} of {n} Dask workers connected within {wait_s:g} s "
            f"(preprocess.dask_slurm_wait_s); their Slurm jobs ({name}): "
            f"{_jobs_by_state(name)}; worker logs in {log_dir}"
        ) from None


@contextlib.contextmanager
def slurm_workers(
    settings: PreprocessConfig, resources: PreprocessResources, log_dir: Path
) -> Iterator[PreprocessConfig]:
    """`settings` as they are if `dask_slurm_workers` is null. Otherwise its number of Dask
    workers, one Slurm job each of `resources` (cluster.preprocess: threads, mem_mb, runtime),
    in this job's partition and account, writing their logs in `log_dir`; yields `settings`
    sent to their scheduler (run here), and cancels the jobs when the block ends, fails, or is
    cancelled (SIGTERM)."""
    n = settings.dask_slurm_workers
    if n is None:
        yield settings
        return
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise PreprocessError(
            f"key '{KEY}' is {n} but dask-jobqueue is not installed (pip install -e '.[dask]'), "
            f"or set it to null"
        ) from None
    host = scheduler_host()
    name = _job_name()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = None
    with signals_raise():
        try:
            cluster = SLURMCluster(
                cores=resources.threads,
                processes=1,
                memory=f"{resources.mem_mb}MiB",  # the worker's memory limit: the job's
                job_mem=f"{resources.mem_mb}M",  # Slurm's M is MiB
                walltime=_walltime(resources.runtime),
                # Unset outside a job (by hand on a login node): the site's defaults.
                queue=os.environ.get("SLURM_JOB_PARTITION"),
                account=os.environ.get("SLURM_JOB_ACCOUNT"),
                job_name=name,
                log_directory=str(log_dir),
                python=sys.executable,
                protocol="tcp",
                death_timeout=WORKER_DEATH_TIMEOUT_S,
                # Free ports: several commands' schedulers may share a node. No dashboard (nobody
                # watches a batch job's); its HTTP server, which always starts, on a free port.
                scheduler_options={
                    "host": host,
                    "port": 0,
                    "dashboard": False,
                    "dashboard_address": f"{host}:0",
                },
            )
            _check_submittable(cluster.job_script(), resources)
            cluster.scale(jobs=n)
            _wait_for_workers(cluster, n, settings.dask_slurm_wait_s, name, log_dir)
            workers = cluster.scheduler_info["workers"].values()
            print(
                f"preprocess: {n} Dask workers as Slurm jobs ({name}), scheduler "
                f"{cluster.scheduler_address}, on "
                f"{', '.join(sorted(w['host'] for w in workers))}",
                file=sys.stderr,
                flush=True,
            )
            yield dataclasses.replace(
                settings, dask_scheduler=cluster.scheduler_address, dask_slurm_workers=None
            )
        finally:
            _cancel(name)
            if cluster is not None:
                cluster.close(timeout=CLOSE_TIMEOUT_S)
