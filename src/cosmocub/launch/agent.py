"""Processes that never outlive the one that started them, and torchrun with its errors on one line.

`exit_with_parent` asks the kernel to signal this process when its parent dies (Linux
PR_SET_PDEATHSIG; a watchdog thread elsewhere). `python -m cosmocub.launch.agent <torchrun args>`
is torchrun as `cosmocub launch` starts it: it hands its pid to the ranks
so that each dies with it, and reports a failed rank or a signal in one line instead of torchrun's
ChildFailedError / SignalException traceback (the job log ends with our lines, not its internals).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from cosmocub.launch.env import AGENT_PID_ENV

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Have `signum` delivered to this process as soon as `parent_pid`, its parent, is gone.

    On Linux the kernel does it (PR_SET_PDEATHSIG, kept across exec, instant, works while the
    process is busy in C code); elsewhere a daemon thread polls the parent pid every 0.5 s.
    A parent that died before this call is caught by comparing getppid with `parent_pid`.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:

        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os.kill(os.getpid(), signum)

        threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def arm_rank() -> None:
    """Called first by every rank: die with the torchrun agent that started it, if one did."""
    agent = os.environ.get(AGENT_PID_ENV)
    if agent:
        exit_with_parent(int(agent))


def run_torchrun(argv: Sequence[str]) -> int:
    """torchrun's main with `argv`; its failures as one line and an exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    os.environ[AGENT_PID_ENV] = str(os.getpid())
    try:
        torchrun_main(list(argv))
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        how = (
            f"signal {signal.Signals(-failure.exitcode).name}"
            if failure.exitcode < 0
            else f"exit {failure.exitcode}"
        )
        print(f"cosmocub launch: rank {rank} stopped first ({how})", file=sys.stderr, flush=True)
        return 1
    except SignalException as err:
        print(
            f"cosmocub launch: torchrun stopped its ranks on {err.sigval.name}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    # The launcher armed this process's death signal before exec (cosmocub.launch.launcher).
    sys.exit(run_torchrun(sys.argv[1:]))
