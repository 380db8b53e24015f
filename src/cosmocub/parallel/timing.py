"""Timing communication without stalling the device: spans between marks on the clock of the
device that ran them, added up only when read (the training loop reads them once per epoch).

On a CPU a mark is the host's perf_counter. On a GPU it is a CUDA event recorded in the current
stream, so a span is device time between two points of its queue, and nothing waits for the
device until the total is read: no torch.cuda.synchronize after every layer or bucket.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import torch

# Spans kept unread before the finished ones among them are added up (a GPU run records events
# faster than anyone reads them; those at the front are long done and read without waiting).
MAX_PENDING = 256


class Clock(Protocol):
    def mark(self) -> Any:
        """A point in time: now on the host, or where the device's current stream has got to."""
        ...

    def done(self, mark: Any) -> bool:
        """Whether the device has reached `mark` (then reading it does not wait)."""
        ...

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from `start` to `end`, waiting for the device to reach `end` if need be."""
        ...


class HostClock:
    """The host's wall clock: where the work runs on the host (CPU, gloo), its time is host time."""

    def mark(self) -> float:
        return time.perf_counter()

    def done(self, mark: float) -> bool:
        return True

    def seconds(self, start: float, end: float) -> float:
        return end - start


class EventClock:
    """CUDA events (enable_timing) recorded in `device`'s current stream: the stream a collective's
    future runs its callbacks on, or the compute stream that waits for it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def done(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # milliseconds


HOST_CLOCK = HostClock()


@functools.cache
def clock_for(device: torch.device) -> Clock:
    """The clock of the device that runs the timed work (`device.type` "cuda": its events)."""
    return EventClock(device) if device.type == "cuda" else HOST_CLOCK


class Spans:
    """Seconds of timed spans since the last reset. A span is the union of one or more intervals
    between marks (one interval: start to end; a bucketed all-reduce: each bucket's launch to its
    completion, so the time some bucket was in flight); spans stay unread until `seconds` is
    asked, or until more than MAX_PENDING wait (then only those already done are read), so
    timing a GPU's queue never makes it wait. Marks from the main thread only."""

    def __init__(self) -> None:
        self._total = 0.0
        self._pending: deque[tuple[Clock, tuple[tuple[Any, Any], ...]]] = deque()

    def add(self, clock: Clock, start: Any, *ends: Any) -> None:
        """The span from `start` to the latest of `ends` (none before `start` counts)."""
        assert ends, "a span needs an end mark"
        self.add_intervals(clock, [(start, end) for end in ends])

    def add_intervals(self, clock: Clock, intervals: Sequence[tuple[Any, Any]]) -> None:
        """The span covered by the (start, end) intervals, once where they overlap."""
        assert intervals, "a span needs an interval"
        self._pending.append((clock, tuple(intervals)))
        if len(self._pending) > MAX_PENDING:
            self._read(wait=False)

    @property
    def pending(self) -> int:
        """Spans not read yet (on a GPU, events whose times are still unread)."""
        return len(self._pending)

    @property
    def seconds(self) -> float:
        self._read(wait=True)
        return self._total

    def reset(self) -> None:
        self._total = 0.0
        self._pending.clear()

    def _read(self, *, wait: bool) -> None:
        while self._pending:
            clock, intervals = self._pending[0]
            if not wait and not all(clock.done(m) for pair in intervals for m in pair):
                return  # the device has not got there: read it later rather than wait now
            self._pending.popleft()
            origin = intervals[0][0]
            self._total += union_length(
                [(clock.seconds(origin, a), clock.seconds(origin, b)) for a, b in intervals]
            )


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (one with end <= start is empty)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
