"""MLPerf result logs (mllog: one `:::MLLOG {json}` line per event) read into a run's times:
its epochs (evaluation inside each taken out of the training epoch; only epochs that end by
run_stop), evaluations, staging (and whether the timed run holds it), and the run itself;
and the system description file the results folder names.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = ":::MLLOG "


@dataclass(frozen=True)
class Event:
    key: str
    time_ms: float
    value: Any
    metadata: dict[str, Any]


def read_events(path: Path) -> list[Event]:
    """The log's events in file order, each line once (some loggers write lines twice); lines
    that are not mllog, or whose JSON is cut off, are left out."""
    seen: set[str] = set()
    events = []
    for line in path.read_text(errors="replace").splitlines():
        start = line.find(PREFIX)
        if start < 0:
            continue
        text = line[start + len(PREFIX) :].strip()
        if text in seen:
            continue
        seen.add(text)
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            continue
        events.append(
            Event(
                key=record.get("key", ""),
                time_ms=float(record.get("time_ms", 0.0)),
                value=record.get("value"),
                metadata=record.get("metadata") or {},
            )
        )
    return events


@dataclass(frozen=True, kw_only=True)
class RunTimes:
    """One run's submission facts and times (seconds): per counted epoch its training part
    (epoch − the evaluation inside it) and its evaluation; staging and where it falls."""

    path: Path
    org: str
    platform: str
    nodes: int
    accelerators_per_node: int
    global_batch: int
    train_samples: int
    eval_samples: int
    run_start_ms: float
    run_s: float
    train_epoch_s: tuple[float, ...]
    eval_s: tuple[float, ...]
    staging_s: float | None
    staging_in_run: bool | None
    dropout: float | None = None  # the log's dropout rate, where it logs one

    @property
    def epochs(self) -> int:
        return len(self.train_epoch_s)

    @property
    def median_train_epoch_s(self) -> float:
        return statistics.median(self.train_epoch_s)

    @property
    def median_eval_s(self) -> float:
        return statistics.median(self.eval_s)

    @property
    def steps_per_epoch(self) -> int:
        return self.train_samples // self.global_batch

    @property
    def step_s(self) -> float:
        return self.median_train_epoch_s / self.steps_per_epoch


def _first(events: list[Event], key: str) -> Event | None:
    return next((e for e in events if e.key == key), None)


def _by_epoch(events: list[Event], key: str) -> dict[int, float]:
    return {
        int(e.metadata["epoch_num"]): e.time_ms
        for e in events
        if e.key == key and "epoch_num" in e.metadata
    }


def run_times(path: Path, events: list[Event] | None = None) -> RunTimes:
    """The run of the log at `path`; a ValueError naming the file where it has no run_start,
    run_stop or counted epoch."""
    events = read_events(path) if events is None else events
    start, stop = _first(events, "run_start"), _first(events, "run_stop")
    if start is None or stop is None:
        raise ValueError(f"{path}: no run_start/run_stop event")
    epoch_start, epoch_stop = _by_epoch(events, "epoch_start"), _by_epoch(events, "epoch_stop")
    eval_start, eval_stop = _by_epoch(events, "eval_start"), _by_epoch(events, "eval_stop")
    train, evals = [], []
    for n in sorted(epoch_stop):
        if n not in epoch_start or epoch_stop[n] > stop.time_ms:
            continue  # logs that go on training after run_stop: not the scored run
        epoch = epoch_stop[n] - epoch_start[n]
        ev = 0.0
        if n in eval_start and n in eval_stop:
            inside = epoch_start[n] <= eval_start[n] and eval_stop[n] <= epoch_stop[n]
            ev = eval_stop[n] - eval_start[n]
            epoch -= ev if inside else 0.0
        train.append(epoch / 1e3)
        evals.append(ev / 1e3)
    if not train:
        raise ValueError(f"{path}: no epoch ends by run_stop")
    s0, s1 = _first(events, "staging_start"), _first(events, "staging_stop")
    staged = s0 is not None and s1 is not None

    def value(key: str, default: Any = 0) -> Any:
        e = _first(events, key)
        return default if e is None else e.value

    dropout = value("dropout", None)
    return RunTimes(
        path=path,
        org=str(value("submission_org", "")),
        platform=str(value("submission_platform", "")),
        nodes=int(value("number_of_nodes")),
        accelerators_per_node=int(value("accelerators_per_node")),
        global_batch=int(value("global_batch_size")),
        train_samples=int(value("train_samples")),
        eval_samples=int(value("eval_samples")),
        run_start_ms=start.time_ms,
        run_s=(stop.time_ms - start.time_ms) / 1e3,
        train_epoch_s=tuple(train),
        eval_s=tuple(evals),
        staging_s=(s1.time_ms - s0.time_ms) / 1e3 if staged else None,
        staging_in_run=(s0.time_ms >= start.time_ms) if staged else None,
        dropout=None if dropout is None else float(dropout),
    )


def system_description(result: Path) -> tuple[str, dict[str, Any] | None]:
    """(system name, its description) for a result log laid out as the MLPerf results
    repositories lay them out: <submitter>/results/<system>/<scale>/<benchmark>/result_*.txt,
    described by <submitter>/systems/<system>.json (None where that file is missing)."""
    parts = result.parts
    if "results" not in parts:
        return result.parent.name, None
    i = len(parts) - 1 - parts[::-1].index("results")
    if i + 1 >= len(parts):
        return result.parent.name, None
    system = parts[i + 1]
    described = Path(*parts[:i], "systems", f"{system}.json")
    if not described.is_file():
        return system, None
    return system, json.loads(described.read_text())


def with_system(run: RunTimes, description: dict[str, Any] | None) -> RunTimes:
    """`run` with the nodes and GPUs a node of its systems file where its log names none (v0.7's
    logs log neither); a ValueError naming the file where neither names them."""
    counts = {"nodes": run.nodes, "accelerators_per_node": run.accelerators_per_node}
    keys = {"nodes": "number_of_nodes", "accelerators_per_node": "accelerators_per_node"}
    for field, key in keys.items():
        if counts[field] == 0:
            text = str((description or {}).get(key, "")).strip()
            if not text.isdigit():
                raise ValueError(f"{run.path}: no {key} in the log nor its systems file")
            counts[field] = int(text)
    return dataclasses.replace(run, **counts)
