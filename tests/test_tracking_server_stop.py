"""The `mlflow server` a workflow starts (tracking.server.start) leaves no process behind: not
after the workflow's end (onsuccess/onerror call finish_tracking), not after a Ctrl-C that ends
Snakemake without them. A real server, in a subprocess standing for Snakemake."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

SNAKEMAKE_STANDIN = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil
    from cosmocub.config import load_config
    from cosmocub.tracking.server import SERVER_PID_ENV
    from cosmocub.tracking.workflow_run import finish_tracking, start_tracking

    cfg, how, out = load_config(sys.argv[1]), sys.argv[2], sys.argv[3]
    start_tracking(cfg, ["all"])  # onstart
    pid = int(os.environ[SERVER_PID_ENV])
    family = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    with open(out, "w") as f:
        json.dump(family, f)
    if how == "interrupt":
        raise KeyboardInterrupt  # Snakemake ends without onsuccess/onerror
    finish_tracking(cfg, "FAILED")  # onerror
    """
)


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
# onerror and the interrupt stop the server through the same stop_server; the suite keeps the
# interrupt (the one Snakemake gives no hook for), `pytest -m long` runs both.
@pytest.mark.parametrize("how", [pytest.param("onerror", marks=pytest.mark.long), "interrupt"])
def test_the_started_server_leaves_no_process(tmp_path: Path, how: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "config.yaml"
    tracking = {
        "experiment": "stop",
        "system_metrics": False,
        "server": {"start": True, "port": port},
    }
    config.write_text(yaml.safe_dump({"results": str(tmp_path / "r"), "tracking": tracking}))
    script = tmp_path / "standin.py"
    script.write_text(SNAKEMAKE_STANDIN)
    out = tmp_path / "family.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(config), how, str(out)],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    family = json.loads(out.read_text())
    try:
        # Python ends an uncaught KeyboardInterrupt by SIGINT, as Snakemake's Ctrl-C would.
        assert proc.returncode == (-2 if how == "interrupt" else 0), proc.stderr[-2000:]
        assert len(family) >= 2, family  # the server and the uvicorn worker it forked, at least
        deadline = time.monotonic() + 10
        while alive(family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(family), f"{alive(family)} of {family} outlived the workflow ({how})"
    finally:
        for pid in alive(family):
            psutil.Process(pid).kill()
