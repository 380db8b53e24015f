"""Runs left RUNNING by a process that died without its `finally` (SIGKILL, the OOM killer): the
next workflow on the same host ends them KILLED, so no run stays RUNNING for ever.

Each run is tagged with its host and the pid that owns it; only runs of this host whose owner is
gone are ended (a pid can be checked here alone; another host's runs are that host's to end).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

log = logging.getLogger(__name__)

PID_TAG = "cosmocub.pid"


def owner_tags() -> dict[str, str]:
    """The tags that name this process as a run's owner."""
    return {"host": socket.gethostname(), PID_TAG: str(os.getpid())}


def end_dead_runs(client: Any, experiment_id: str) -> int:
    """End KILLED every RUNNING run of `experiment_id` owned by a dead process of this host;
    returns how many."""
    host = socket.gethostname().replace("'", "")
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"attributes.status = 'RUNNING' and tags.host = '{host}'",
        max_results=1000,
    )
    ended = 0
    for run in runs:
        pid = run.data.tags.get(PID_TAG, "")
        if not pid.isdigit() or _alive(int(pid)):
            continue
        client.set_terminated(run.info.run_id, status="KILLED")
        ended += 1
    if ended:
        log.info("MLflow: ended %d run(s) whose process on this host had died (KILLED)", ended)
    return ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True
