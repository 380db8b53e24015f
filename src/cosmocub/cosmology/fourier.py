"""Real FFTs and wavevector grids for periodic cubes, with the time spent in FFTs counted.

scipy.fft keeps float32 input in single precision (numpy.fft always works in float64), which
halves memory and roughly doubles speed for the N³ and (2N)³ meshes of a simulation.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.fft


class TimedFFT:
    """rfftn / irfftn over all three axes; `seconds` accumulates their wall time."""

    def __init__(self, *, workers: int | None = None) -> None:
        # One thread by default: the workflow runs one simulation per core.
        self.workers = workers
        self.seconds = 0.0
        self.calls = 0

    def rfftn(self, field: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = scipy.fft.rfftn(field, workers=self.workers, overwrite_x=False)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out

    def irfftn(
        self, field_k: np.ndarray, n: int, *, axes: tuple[int, int, int] = (-3, -2, -1)
    ) -> np.ndarray:
        """The real n³ field of `field_k`, transformed over `axes` (the others are a batch:
        several fields in one call, e.g. channels last)."""
        start = time.perf_counter()
        # overwrite_x=True was slower here (pocketfft then works in the strided input).
        out = scipy.fft.irfftn(
            field_k, s=(n, n, n), axes=axes, workers=self.workers, overwrite_x=False
        )
        self.seconds += time.perf_counter() - start
        self.calls += field_k.size // int(np.prod([field_k.shape[a] for a in axes]))
        return out


def wavevectors(n: int, *, spacing: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Angular wavenumbers of an rfftn grid of n³ cells of side `spacing`, as broadcastable
    float32 arrays of shapes (n, 1, 1), (1, n, 1), (1, 1, n//2 + 1). The Nyquist component is set
    to 0, so a derivative i·k of a real field stays real there (the usual choice in PM codes)."""
    k1d = (2.0 * np.pi * np.fft.fftfreq(n, d=spacing)).astype(np.float32)
    kz = (2.0 * np.pi * np.fft.rfftfreq(n, d=spacing)).astype(np.float32)
    if n % 2 == 0:
        k1d[n // 2] = 0.0
        kz[-1] = 0.0
    return k1d[:, None, None], k1d[None, :, None], kz[None, None, :]


def wavenumber_squared(n: int, *, spacing: float = 1.0) -> np.ndarray:
    """|k|² on the rfftn grid including the Nyquist components, shape (n, n, n//2 + 1), float32;
    the k = 0 entry is set to 1 so it can divide (callers zero that mode themselves)."""
    k1d = (2.0 * np.pi * np.fft.fftfreq(n, d=spacing)).astype(np.float32)
    kz = (2.0 * np.pi * np.fft.rfftfreq(n, d=spacing)).astype(np.float32)
    k2 = k1d[:, None, None] ** 2 + k1d[None, :, None] ** 2 + kz[None, None, :] ** 2
    k2[0, 0, 0] = 1.0
    return k2
