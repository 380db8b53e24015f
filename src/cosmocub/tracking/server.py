"""An `mlflow server` that the workflow starts for the length of one invocation (tracking.server).

Jobs then log over HTTP instead of opening the SQLite file themselves, which is what a cluster
whose nodes share no reliable file locking needs; artifacts go through the server (proxied) into
<results>/mlartifacts. The backend is <results>/mlflow.db unless backend_store_uri says otherwise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cosmocub.config import Config

# Where the Snakefile keeps the server's pid between onstart and onsuccess/onerror.
SERVER_PID_ENV = "COSMOCUB_MLFLOW_SERVER_PID"
START_TIMEOUT_S = 90.0


class TrackingServerError(ValueError):
    """The server could not start; the message names the address and the server's last words."""


def server_uri(cfg: Config) -> str:
    """The URI jobs log to. A server listening everywhere is reached by this host's name."""
    host = cfg.tracking.server.host
    if host in ("0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"http://{host}:{cfg.tracking.server.port}"


def server_command(cfg: Config) -> list[str]:
    results = Path(os.path.abspath(cfg.results))
    backend = cfg.tracking.server.backend_store_uri or f"sqlite:///{results / 'mlflow.db'}"
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend,
        "--serve-artifacts",
        "--artifacts-destination",
        (results / "mlartifacts").as_uri(),
        "--host",
        cfg.tracking.server.host,
        "--port",
        str(cfg.tracking.server.port),
        "--workers",
        "1",
    ]


def server_env() -> dict[str, str]:
    """The server's environment: MLflow's server-side jobs off unless the user turned them on.
    The workflow uses none, and they cost a job runner and 8 huey consumers (~10 s more to start
    on a loaded 2-core machine: 20 s against 8)."""
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start_server(cfg: Config) -> subprocess.Popen:
    """Start the server and wait until it answers; raise TrackingServerError if it cannot."""
    uri = server_uri(cfg)
    if _healthy(uri):
        raise TrackingServerError(
            f"key 'tracking.server.port': something already answers at {uri}; choose another "
            f"port, or log to it with tracking.uri instead of starting a server"
        )
    results = Path(os.path.abspath(cfg.results))
    (results / "logs").mkdir(parents=True, exist_ok=True)
    log_path = results / "logs" / "mlflow-server.log"
    with open(log_path, "ab") as log:
        # A session (and process group) of its own: the server forks uvicorn, a job runner and
        # huey consumers, and stop_server ends them all by signalling the group; nor does a
        # Ctrl-C at the terminal reach it except through the workflow's own onerror.
        proc = subprocess.Popen(
            server_command(cfg),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=server_env(),
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _healthy(uri):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc.pid)
            tail = " ".join(log_path.read_text(errors="replace").split()[-40:])
            raise TrackingServerError(
                f"key 'tracking.server': mlflow server at {uri} did not start "
                f"(see {log_path}): {tail[-300:]}"
            )
        time.sleep(0.5)
    return proc


def stop_server(pid: int, *, timeout_s: float = 20.0) -> None:
    """SIGTERM the server's process group (it leads one: start_server), SIGKILL what is left of
    the group after `timeout_s`; reap the leader if ours. Signalling the leader alone left its
    uvicorn worker and huey consumers serving after it was gone."""
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        group = pid  # the leader is gone; its group may not be
    if group != pid:
        raise TrackingServerError(f"mlflow server pid {pid} does not lead its process group")
    if not _signal_group(pid, signal.SIGTERM):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not _signal_group(pid, 0):  # no process of the group is left
            return
        time.sleep(0.2)
    _signal_group(pid, signal.SIGKILL)
    _reap(pid)


def _signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid`; False where no process of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    # Not our child (stopped from another process) or reaped already: nothing to reap.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
