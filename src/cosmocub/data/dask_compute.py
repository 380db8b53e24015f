"""Running one preprocessing graph: on local Dask threads with progress lines, or on a Dask
distributed cluster whose workers write the shards themselves and report which host wrote what."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections import Counter
from typing import Any

import dask.array as da
import numpy as np
from dask.callbacks import Callback

from cosmocub.config import PreprocessConfig
from cosmocub.data.splits import PreprocessError

PROGRESS_EVERY_S = 30.0
DASK_CONNECT_TIMEOUT_S = 5


class _LogProgress(Callback):
    """Periodic progress lines for non-interactive logs (Dask's ProgressBar redraws a tty line)."""

    def __init__(self, every_s: float, total_bytes: int) -> None:
        super().__init__()
        self.every_s, self.total_bytes = every_s, total_bytes

    def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
        self.total = sum(len(state[k]) for k in ("ready", "waiting", "running"))
        self.done, self.t0 = 0, time.perf_counter()
        self.last = self.t0

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            share = self.done / max(self.total, 1)
            rate = share * self.total_bytes / (now - self.t0) / 1e6
            print(
                f"preprocess: {share:.0%} of {self.total} tasks, ~{rate:.0f} MB/s of input",
                file=sys.stderr,
                flush=True,
            )


def _progress(total_bytes: int) -> contextlib.AbstractContextManager:
    if sys.stderr.isatty():
        from dask.diagnostics import ProgressBar

        return ProgressBar(out=sys.stderr)
    return _LogProgress(PROGRESS_EVERY_S, total_bytes)


def _distributed_client(address: str) -> Any:
    try:
        from dask.distributed import Client
    except ImportError:
        raise PreprocessError(
            f"preprocess.dask_scheduler is {address!r} but dask.distributed is not installed "
            f"(pip install distributed), or set it to null for local threads"
        ) from None
    try:
        # A few seconds, not distributed's 30 s default: a wrong address should fail fast.
        return Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as err:
        raise PreprocessError(
            f"key 'preprocess.dask_scheduler': no Dask scheduler answers at {address!r} within "
            f"{DASK_CONNECT_TIMEOUT_S} s ({type(err).__name__}); start it, or set it to null for "
            f"local threads"
        ) from None


def _write_block(block: np.ndarray, target: Any, block_info: Any = None) -> np.ndarray:
    """Write `block` at its place in `target` (what `da.store` does for a block) and return the
    name of the host that wrote it, as a block of one element."""
    where = tuple(slice(start, stop) for start, stop in block_info[0]["array-location"])
    target[where] = block
    return np.full((1,) * block.ndim, socket.gethostname(), dtype=object)


def _writes(samples: da.Array, target: Any) -> da.Array:
    """`samples` written block by block into `target`: an array of the writers' host names, one
    element a block."""
    return samples.map_blocks(
        _write_block,
        target,
        chunks=tuple((1,) * n for n in samples.numblocks),
        dtype=object,
        meta=np.empty((0,) * samples.ndim, dtype=object),
        name=f"write-{samples.name}",
    )


def compute_into(
    samples: dict[str, da.Array],
    targets: dict[str, Any],
    hist: da.Array,
    hist_out: np.ndarray,
    settings: PreprocessConfig,
    total_bytes: int,
) -> dict[str, dict[str, int]] | None:
    """Run the graph: each `samples[key]` stored into `targets[key]` (a shard's chunk writer),
    the training histogram into `hist_out`. On a Dask cluster, returns which hosts wrote each
    key's blocks ({key: {host: blocks}}, as the workers themselves reported); None on threads."""
    if settings.dask_scheduler:
        with _distributed_client(settings.dask_scheduler) as client:
            # Workers write the shards themselves (the writers pickle, the filesystem is shared)
            # and say where they ran; one submission, so the histogram shares the shard reads;
            # futures keep their order.
            writes = [_writes(samples[key], targets[key]) for key in samples]
            *hosts, hist_out[...] = client.gather(client.compute([*writes, hist]))
        return {
            key: dict(sorted(Counter(where.ravel().tolist()).items()))
            for key, where in zip(samples, hosts, strict=True)
        }
    stored = [targets[key] for key in samples]
    # One store for everything: the training histogram shares its reads with the shard writes,
    # so every universe is read from disk once.
    stores = da.store(
        [*samples.values(), hist],
        [*stored, hist_out],
        lock=False,  # blocks never share a chunk, and the histogram is one block
        compute=False,
    )
    with _progress(total_bytes):
        da.compute(*stores, scheduler="threads", num_workers=settings.num_workers)
    return None
