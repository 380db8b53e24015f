"""Metrics on their way to the MLflow store, sent from a background thread with a circuit breaker.

The training loop hands metrics over and goes on: a store that stops answering costs it nothing,
and what could not be sent is kept (and, at the end, written to mlflow-pending/ for later).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from cosmocub.tracking.store import environ_set

log = logging.getLogger(__name__)

# MLflow's log_batch takes at most 1000 metrics a call.
BATCH = 1000
# MLflow's own HTTP retries for a job's calls after its start: one retry, at once (urllib3 waits
# only from the second), 20 s a request. Its defaults (7 retries, backoff factor 2, 120 s) spent
# ~245 s on one call to a dead server; the sender retries by itself, so this layer need not.
JOB_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


@contextlib.contextmanager
def job_http_timeouts() -> Iterator[None]:
    """MLflow's HTTP calls inside this block give up within seconds (JOB_HTTP_ENV)."""
    # A user's own, stricter setting wins.
    with environ_set({k: v for k, v in JOB_HTTP_ENV.items() if k not in os.environ}):
        yield


class MetricSender:
    """Sends one run's metrics in order from a daemon thread; `put` never waits for the store.

    After `max_failures` failed sends in a row the circuit opens: nothing is tried for
    `cooldown_s` (doubling up to `max_cooldown_s`), then the oldest batch is tried again. Metrics
    wait in memory meanwhile, at most `max_backlog` of them (then the oldest per-step values are
    dropped first: every epoch's values are in metrics.jsonl too, and are replayed from there).
    """

    def __init__(
        self,
        client: Any,
        run_id: str,
        *,
        max_failures: int = 3,
        cooldown_s: float = 2.0,
        max_cooldown_s: float = 60.0,
        max_backlog: int = 200_000,
    ) -> None:
        self.client, self.run_id = client, run_id
        self.max_failures, self.max_backlog = max_failures, max_backlog
        self.cooldown_s, self.max_cooldown_s = cooldown_s, max_cooldown_s
        self.backlog: list[Any] = []  # mlflow.entities.Metric, oldest first
        self.failures = 0  # failed sends, in all
        self.dropped = 0
        self._in_a_row = 0
        self._open_until = 0.0
        self._cooldown = cooldown_s
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"mlflow-{run_id[:8]}", daemon=True)
        self._thread.start()

    @property
    def circuit_open(self) -> bool:
        return self._in_a_row >= self.max_failures

    def put(self, metrics: list[Any]) -> None:
        with self._cond:
            self.backlog.extend(metrics)
            if len(self.backlog) > self.max_backlog:
                self._shed()
            self._cond.notify()

    def try_now(self, timeout_s: float) -> bool:
        """With the circuit open, try the store at once (a caller about to make a call of its
        own): wait up to `timeout_s` for what is kept to go; True when the store took it."""
        with self._cond:
            if not self.circuit_open:
                return True
            if not self.backlog:  # nothing to try with: the caller's own call is the probe
                self._in_a_row = 0
                return True
            failures = self.failures
            self._open_until = 0.0
            self._cond.notify_all()
            deadline = time.monotonic() + timeout_s
            while self.circuit_open and self.failures == failures:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return not self.circuit_open

    def close(self, timeout_s: float) -> list[Any]:
        """Try to send what is left (once more, whatever the circuit says) for at most
        `timeout_s`; stop the thread; return what was not sent."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._open_until = 0.0
            self._cond.notify()
            while self.backlog and self._open_until >= 0 and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            unsent = list(self.backlog)
            self.backlog.clear()  # the thread's send in flight, if any, is dropped from here on
            self._cond.notify()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return unsent

    def _shed(self) -> None:
        # Per-step values go first; epoch values stay (they are also replayed from metrics.jsonl).
        excess = len(self.backlog) - self.max_backlog
        kept = []
        for metric in self.backlog:
            if excess > 0 and metric.key.endswith("_step"):
                excess -= 1
                self.dropped += 1
            else:
                kept.append(metric)
        if excess > 0:
            self.dropped += excess
            kept = kept[excess:]
        self.backlog = kept

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self.backlog or time.monotonic() < self._open_until:
                    if self._closing and not self.backlog:
                        return
                    wait = None if not self.backlog else self._open_until - time.monotonic()
                    self._cond.wait(wait)
                if self._closing and self.failures and self._open_until < 0:
                    return  # the last try at close failed: keep the rest for mlflow-pending/
                batch = self.backlog[:BATCH]
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as err:  # an outage: kept and tried again, never raised
                self._failed(err)
                continue
            with self._cond:
                # Those sent are the oldest; close() may have taken the backlog meanwhile.
                head = self.backlog[: len(batch)]
                if len(head) == len(batch) and all(map(operator.is_, head, batch)):
                    del self.backlog[: len(batch)]
                if self.circuit_open:
                    log.warning(
                        "MLflow: store answers again; sending %d kept metric value(s) to run %s",
                        len(self.backlog),
                        self.run_id,
                    )
                self._in_a_row, self._cooldown = 0, self.cooldown_s
                self._cond.notify_all()

    def _failed(self, err: Exception) -> None:
        with self._cond:
            self.failures += 1
            self._in_a_row += 1
            if self._closing:
                self._open_until = -1.0  # marks the last try as failed (see _run)
                self._cond.notify_all()
                return
            if self._in_a_row == self.max_failures:
                log.warning(
                    "MLflow: %d sends in a row to run %s failed (%s); training goes on, metrics "
                    "are kept and sent when the store answers",
                    self._in_a_row,
                    self.run_id,
                    " ".join(str(err).split())[:200],
                )
            if self.circuit_open:
                self._open_until = time.monotonic() + self._cooldown
                self._cooldown = min(self.max_cooldown_s, 2 * self._cooldown)
            self._cond.notify_all()
