"""The process's allocator, set so that a training step's large tensors are reused, not faulted in
again every step.

glibc's malloc serves every block of 32 MiB or more (its mmap threshold's ceiling on 64-bit,
DEFAULT_MMAP_THRESHOLD_MAX) with a fresh mmap and gives it back with munmap when freed, and
trims the heap's top above 128 KiB. torch's CPU allocator caches nothing, so a step whose
activations reach 32 MiB (the default CosmoFlow's first block at batch 16: 16 channels × 32³ ×
16 samples × 4 bytes, exactly 32 MiB) maps, zero-fills and unmaps them every step. Measured on
the 2-core VM here (2026-12-07, load ~1): that block's forward and backward took 42,600 minor
faults a step at batch 16 against 23,000 at 15, and 1.5× the time per sample; the whole default
model's step at batch 16 took 23–31 ms a sample against 14–19 with mmap off (near 0 faults).

`keep_freed_memory` turns mmap off for malloc (M_MMAP_MAX 0) and stops the heap's trimming
(M_TRIM_THRESHOLD): freed blocks stay in the process for the next step, which asks for the same
sizes. The price is that the process keeps its peak memory until it ends, as a caching
allocator does. The calibration sets the same, so what it times is what training runs.
`mallopt` is glibc's own interface for it (no allocator to install and preload); elsewhere (musl,
macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt's parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# The largest trim threshold mallopt takes (an int): past it, the heap's top is never given back.
NEVER_TRIM = 2**31 - 1


@functools.cache
def keep_freed_memory() -> str:
    """Once per process: malloc keeps what is freed (module docstring). Returns what was set,
    for the run's record: "glibc: mmap off, no trim", or why nothing was."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return f"unchanged: no mallopt in {name or 'the C library'}"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not (mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)):
        return "unchanged: mallopt refused"
    return "glibc: mmap off, no trim"
