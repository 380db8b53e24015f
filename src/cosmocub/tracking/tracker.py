"""The tracker a job logs through: one MLflow run, every call guarded after the job's start.

Metrics go through a background sender (tracking/sender.py), so a slow or dead store never
stalls the job; other store failures mid-run are reported and counted, never raised (the metrics
are on disk too); a bad call (changing a logged param, a missing artifact) still raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cosmocub.tracking.models import log_torch_model
from cosmocub.tracking.pending import param_value
from cosmocub.tracking.sender import MetricSender

log = logging.getLogger(__name__)

# MLflow error codes that mean the call itself was wrong: these propagate even mid-run.
_CALLER_ERROR_CODES = {
    "INVALID_PARAMETER_VALUE",
    "RESOURCE_ALREADY_EXISTS",
    "RESOURCE_DOES_NOT_EXIST",
    "BAD_REQUEST",
    "INVALID_STATE",
}


# How long a call of the tracker's own waits for a store the sender found down to answer again.
PROBE_TIMEOUT_S = 5.0


class NullTracker:
    """What a job gets when tracking is off or it is not world rank 0: every call does nothing."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        pass

    def log_model(self, model: Any, name: str = "model") -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def adopt(
        self, child_run_id: str, *, tags: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> None:
        pass

    def end(self, status: str) -> None:
        pass


class Tracker(NullTracker):
    """Logs to one MLflow run through a client bound to its URI; only `log_model` sets MLflow's
    global tracking URI (tracking/models.py), so concurrent jobs must be processes, not threads."""

    def __init__(self, uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.run_id = run_id
        self.client = MlflowClient(tracking_uri=uri)
        self.failures = 0
        self.sender = MetricSender(self.client, run_id)
        # What could not be sent, for the run's pending record: (path, artifact_path) and
        # (model, name).
        self.unsent_artifacts: list[tuple[str, str | None]] = []
        self.unsent_models: list[tuple[Any, str]] = []

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        with self._guard("log_params"):
            batch = [Param(str(k), param_value(v)) for k, v in params.items()]
            self.client.log_batch(self.run_id, params=batch)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # Handed to the sender: the caller (a training loop) never waits for the store.
        self.sender.put([Metric(str(k), float(v), now, step or 0) for k, v in metrics.items()])

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        # A missing local file is the caller's bug, not a store outage: never swallow it.
        if not Path(path).exists():
            raise FileNotFoundError(f"{path}: artifact to log does not exist")
        failures = self.failures
        # A store known to be down is tried once more (with what the sender keeps), not waited on.
        up = self.sender.try_now(PROBE_TIMEOUT_S)
        if up:
            with self._guard("log_artifact"):
                self.client.log_artifact(self.run_id, str(path), artifact_path)
        if not up or self.failures > failures:
            self.unsent_artifacts.append((os.path.abspath(path), artifact_path))

    def log_model(self, model: Any, name: str = "model") -> None:
        """Log a torch model so that `mlflow.pytorch.load_model(f"runs:/{run_id}/{name}")` works;
        with the store down, keep it for the run's pending record (delivered into this run)."""
        model = getattr(model, "module", model)  # unwrap DDP and the like
        failures = self.failures
        up = self.sender.try_now(PROBE_TIMEOUT_S)
        if up:
            with self._guard("log_model", broad=True):
                log_torch_model(self.client, self.run_id, model, name)
        else:
            self.failures += 1
        if not up or self.failures > failures:
            self.unsent_models.append((model, name))
            log.warning("MLflow: store down, model %r kept for run %s", name, self.run_id)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        with self._guard("set_tags"):
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def adopt(
        self, child_run_id: str, *, tags: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> None:
        """Make run `child_run_id` (in the same store) a child of this run and log `tags` and
        `metrics` on it: how a study's run takes in its points' training runs."""
        with self._guard(f"adopt run {child_run_id}"):
            self.client.set_tag(child_run_id, "mlflow.parentRunId", self.run_id)
            for key, value in tags.items():
                self.client.set_tag(child_run_id, key, str(value))
            for key, value in metrics.items():
                self.client.log_metric(child_run_id, key, float(value))

    def close(self, timeout_s: float) -> list[Any]:
        """Send the metrics still waiting, for at most `timeout_s`; return those not sent."""
        unsent = self.sender.close(timeout_s)
        self.failures += self.sender.failures
        return unsent

    def end(self, status: str) -> bool:
        """Close the run with FINISHED, FAILED or KILLED; False when the store did not take it."""
        failures = self.failures
        with self._guard("set_terminated"):
            self.client.set_terminated(self.run_id, status=status)
        return self.failures == failures

    @contextlib.contextmanager
    def _guard(self, what: str, *, broad: bool = False) -> Iterator[None]:
        # The store was checked at job start; a failure now (server restart, network blip after
        # MLflow's own retries) must not throw away hours of training whose metrics are also on
        # disk, so it is reported loudly and the job goes on. `broad` also covers serialisation
        # errors: log_model runs after model.pt is written, and failing the job there would make
        # Snakemake delete that model.
        from mlflow.exceptions import MlflowException

        try:
            yield
        except Exception as err:
            if not (broad or isinstance(err, MlflowException | OSError)):
                raise
            if getattr(err, "error_code", None) in _CALLER_ERROR_CODES:
                raise  # a bad call (e.g. changing a logged param), not an outage
            self.failures += 1
            log.warning("MLflow %s failed for run %s at %s: %s", what, self.run_id, self.uri, err)
