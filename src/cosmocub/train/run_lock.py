"""One training per run folder: an OS lock on RUN_DIR/train.lock, held by rank 0 while it trains.

flock is released by the kernel when its holder dies (also by `kill -9` or the OOM killer), so a
crashed run never leaves a stale lock; the file's text names the holder for the refusal message.
On a shared file system it needs working locks (NFSv4; Lustre and GPFS with flock enabled).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
from pathlib import Path

LOCK_FILE = "train.lock"


class RunFolderBusyError(ValueError):
    """Another training holds the run folder (a user error: the launcher does not start again)."""


class RunLock:
    """The held lock on `run_dir`; `release()` (or the process's end) lets the next one in."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir, self._fd = run_dir, fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = -1


def acquire_run_lock(run_dir: Path) -> RunLock:
    """Take the run folder's lock without waiting, or raise RunFolderBusyError naming the holder.

    The file is never deleted (an unlink would let two processes lock two different files of one
    name); it is created once and its text rewritten by each holder.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a process"
        os.close(fd)
        raise RunFolderBusyError(
            f"{path}: run folder in use by another training ({holder}); wait for it to end, "
            "stop it, or train into another --out"
        ) from None
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = f"host {socket.gethostname()} pid {os.getpid()} since {started}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)
    return RunLock(run_dir, fd)


def hold_run_folder(run_dir: Path, *, is_main: bool, world_size: int) -> RunLock | None:
    """Rank 0 takes the lock; every rank learns the outcome (a broadcast), so that a refusal
    stops all of them with the same one-line error before anything in the folder is touched.
    Returns rank 0's lock (None elsewhere)."""
    import torch.distributed as dist

    lock, refusal = None, None
    if is_main:
        try:
            lock = acquire_run_lock(run_dir)
        except RunFolderBusyError as err:
            refusal = str(err)
    if world_size > 1:
        said = [refusal]
        dist.broadcast_object_list(said, src=0)
        refusal = said[0]
    if refusal is not None:
        raise RunFolderBusyError(refusal)
    return lock
