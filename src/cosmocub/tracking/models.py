"""A torch model logged into an MLflow run, now or later from the copy a store outage left.

One path for both, so a model delivered from `mlflow-pending/` loads back as one logged at the
job's end does: `mlflow.pytorch.load_model(f"runs:/{run_id}/{name}")`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cosmocub.io import atomic_path


def log_torch_model(client: Any, run_id: str, model: Any, name: str) -> None:
    """Log `model` into run `run_id` of `client`'s store, under `name`.

    Pickle serialisation (torch.export would need an input example) and an explicit pip
    requirement list, so logging takes a second instead of an environment inference. Sets MLflow's
    global tracking URI (Model.log reads it), so concurrent jobs must be processes, not threads.
    """
    import mlflow
    import mlflow.pytorch
    import torch

    # Create the logged model through our client, in the run's experiment: left to itself,
    # Model.log would file it under the global default experiment ("0", in ./mlruns).
    experiment_id = client.get_run(run_id).info.experiment_id
    logged = client.create_logged_model(experiment_id, name=name, source_run_id=run_id)
    mlflow.set_tracking_uri(client.tracking_uri)
    torch_version = torch.__version__.split("+")[0]
    with _quiet("mlflow.pytorch"):  # its pickle warning is about loading untrusted files
        mlflow.pytorch.log_model(
            model,
            name=name,
            run_id=run_id,
            model_id=logged.model_id,
            serialization_format="pickle",
            pip_requirements=[f"torch=={torch_version}", f"mlflow=={mlflow.__version__}"],
        )


def save_unsent_model(model: Any, path: Path) -> None:
    """Keep `model` (the module, pickled as MLflow's pickle flavour would) at `path`, atomically."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(model, tmp)


def load_unsent_model(path: Path) -> Any:
    """The module `save_unsent_model` kept: a pickle this job's own kind wrote, not a download."""
    import torch

    return torch.load(path, weights_only=False)


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
