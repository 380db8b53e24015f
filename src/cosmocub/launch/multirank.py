"""Start a multi-rank command for tests and benchmarks, and leave nothing behind when it hangs.

`run_ranks` runs a command (e.g. `launch.torchrun.torchrun_argv`) in a session of its own and,
on timeout, kills every process it started — torchrun's ranks run in sessions of their own, so
killing the group alone would orphan them: the tree is walked before anything is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from cosmocub.launch.env import LAUNCH_VARS


def rank_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment with one thread per rank and no enclosing launcher's variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**env, "OMP_NUM_THREADS": "1", **(extra or {})}


def start_ranks(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
) -> subprocess.Popen:
    """argv in a new session (its own process group), text output captured by default."""
    return subprocess.Popen(
        list(argv),
        env=dict(env) if env is not None else rank_env(),
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def kill_tree(proc: subprocess.Popen) -> list[int]:
    """SIGKILL `proc`, its process group and every descendant, wherever their sessions; reaps
    `proc`. Returns the pids that were signalled."""
    import psutil  # the test extra's (also distributed's); not needed to train

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    pids = [proc.pid, *(p.pid for p in family)]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stops the leader spawning more, first
    for pid in pids[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    return pids


def run_ranks(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess:
    """Run argv to its end (stdout and stderr captured as text); past `timeout` seconds kill
    the whole tree and raise subprocess.TimeoutExpired with what it had printed."""
    proc = start_ranks(argv, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(list(argv), timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
