"""One engine for every study: a base config, a list of override points, one training run per
point (through `cosmocub launch -- train`, or another runner), and a gather into a TSV, a plot,
a report section and one MLflow parent run whose children are the points' training runs.

A study is a `StudyDefinition` (its points and how a point's outputs become table rows) in its
own module, registered in STUDY_MODULES; the Snakemake rules (workflow/rules/studies.smk) are the
same for every study and take its name as a wildcard.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmocub.config import Config, ConfigError, config_hash, deep_merge, derive
from cosmocub.contention.marks import condition_row, conditions_note
from cosmocub.io import atomic_path, read_json, read_jsonl, write_json, write_tsv
from cosmocub.studies.launch_plan import LaunchPlan, PointLaunch, plan_launch

log = logging.getLogger(__name__)

# name -> module defining STUDY; a new study is one entry here and one config block.
STUDY_MODULES = {
    "sample_size": "cosmocub.studies.sample_size",
    "universes": "cosmocub.studies.universes",
    "step_time": "cosmocub.studies.step_time",
    "network": "cosmocub.studies.network",
    "scaling": "cosmocub.studies.scaling",
    "known_answer": "cosmocub.studies.known_answer",
}
# Sections a point may not override: every point trains on the base config's universes, writes
# under the same results folder and logs to the same store, on the resources of the same profile.
FIXED_SECTIONS = ("results", "universes", "simulate", "tracking", "cluster", "studies")
# What decides a point's shards: points that agree on these share one set.
SHARD_SECTIONS = ("seed", "universes", "preprocess")
POINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
POINT_FILE = "point.json"


@dataclass(frozen=True, kw_only=True)
class Point:
    """One training run of a study.

    overrides: deep-merged into the base config's values (a dict may replace a whole section
    value by giving it in full); labels: the columns that name the point in the table; launch:
    its rank layout (nodes, ranks_per_node, rate_mbit); runner: its name in
    cosmocub.studies.runners.RUNNERS.
    """

    name: str
    overrides: Mapping[str, Any]
    labels: Mapping[str, Any] = field(default_factory=dict)
    launch: PointLaunch = field(default_factory=PointLaunch)
    runner: str = "local"

    def __post_init__(self) -> None:
        if not POINT_NAME.fullmatch(self.name):
            raise ConfigError(f"study point name {self.name!r}: use letters, digits, _ . -")
        fixed = sorted(set(self.overrides) & set(FIXED_SECTIONS))
        if fixed:
            raise ConfigError(
                f"study point {self.name!r}: overrides {fixed}, which every point shares "
                f"({', '.join(FIXED_SECTIONS)})"
            )


@dataclass(frozen=True, kw_only=True)
class PointOutputs:
    """What a point left on disk: its folder, its run folder and (if evaluated) eval folder."""

    point: Point
    folder: Path

    @property
    def run_dir(self) -> Path:
        return self.folder / "run"

    @property
    def eval_dir(self) -> Path:
        return self.folder / "eval"

    def train_summary(self) -> dict[str, Any]:
        return read_json(self.run_dir / "train_summary.json")

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(
            self.run_dir / "metrics.jsonl",
            not_found="not found (the point's training did not finish)",
        )

    def record(self) -> dict[str, Any]:
        """point.json: the launch settings and what the runner reported (bytes on the wire, …)."""
        return read_json(self.folder / POINT_FILE)


@dataclass(frozen=True, kw_only=True)
class StudyDefinition:
    """points(cfg): the points; rows(outputs, cfg): a point's table rows (with its labels);
    plot(rows, path): the PNG; point_metrics(rows): the numbers logged on the point's MLflow run
    (the same names for every point, so MLflow's chart view compares them)."""

    name: str
    config_key: str
    columns: tuple[str, ...]
    points: Callable[[Config], list[Point]]
    rows: Callable[[PointOutputs, Config], list[dict[str, Any]]]
    plot: Callable[[Sequence[Mapping[str, Any]], Path], None]
    point_metrics: Callable[[Sequence[Mapping[str, Any]]], dict[str, float]]
    evaluate: bool = False
    description: str = ""
    # finish(rows): columns that compare points (e.g. speedup over a reference point), after
    # every point's rows are read; skipped points' rows have no measurements.
    finish: Callable[[list[dict[str, Any]], Config], list[dict[str, Any]]] | None = None
    # extra_section(rows, cfg): markdown after the table in the report (e.g. over seeds).
    extra_section: Callable[[Sequence[Mapping[str, Any]], Config], str] | None = None
    # check(cfg): what the points need of the base config beyond each point's own validity
    # (enough universes, say), a ConfigError otherwise; run by `check_study` in the study's own
    # jobs, not where the workflow plans every study at parse time (the default config need
    # not fit every study's).
    check: Callable[[Config], None] | None = None
    timed: bool = True  # False: not times (accuracy); a contended point is kept and marked


def definition(name: str) -> StudyDefinition:
    if name not in STUDY_MODULES:
        raise ValueError(f"study {name!r}: unknown ({', '.join(sorted(STUDY_MODULES))})")
    return importlib.import_module(STUDY_MODULES[name]).STUDY


def check_study(cfg: Config, name: str) -> None:
    """The study's own check of the base config (StudyDefinition.check), where it has one."""
    if (check := definition(name).check) is not None:
        check(cfg)


def study_points(cfg: Config, name: str) -> list[Point]:
    points = definition(name).points(cfg)
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        raise ConfigError(f"study {name!r}: point names repeat: {names}")
    return points


def find_point(cfg: Config, study: str, point: str) -> Point:
    for p in study_points(cfg, study):
        if p.name == point:
            return p
    names = [p.name for p in study_points(cfg, study)]
    raise ValueError(f"study {study!r}: no point {point!r} (points: {', '.join(names)})")


def point_config(cfg: Config, study: str, point: Point) -> Config:
    """The point's config: the base values, its overrides, and run name `<study>_<point>`;
    validated against the schema and the typed checks."""
    named = {"train": {"run_name": f"{study}_{point.name}"}}
    # The world the point's runner starts is the world its config names (training refuses any
    # other): the study's nodes and ranks per node, where it gives them.
    if point.launch.nodes is not None:
        named["cluster"] = {"train": {"nodes": point.launch.nodes}}
    if point.launch.ranks_per_node is not None:
        named["train"]["ranks_per_node"] = point.launch.ranks_per_node
    overrides = deep_merge(dict(point.overrides), named)
    return derive(cfg, overrides, source=f"study {study} point {point.name}")


def point_values(cfg: Config, study: str, point: Point) -> dict[str, Any]:
    """The point's resolved config values (`point_config`), as its config file holds them."""
    return point_config(cfg, study, point).values


def point_launch_plan(study: str, point: Point, point_cfg: Config) -> LaunchPlan:
    """What `cosmocub study-point` runs for `point` (planned here once, for the workflow's DAG
    and for the plan file study-point-config writes)."""
    return plan_launch(
        study=study,
        name=point.name,
        runner=point.runner,
        labels=point.labels,
        launch=point.launch,
        point_cfg=point_cfg,
    )


def shard_key(values: Mapping[str, Any]) -> str:
    """Points with the same data sections share one set of shards, named by their hash."""
    return "data-" + config_hash({k: values[k] for k in SHARD_SECTIONS})[:10]


def shards_dir(cfg: Config, values: Mapping[str, Any]) -> str:
    """The base run's shards when the point's data sections are the base's, else the study
    shards of its key (made by the study_preprocess rules)."""
    if shard_key(values) == shard_key(cfg.values):
        return str(cfg.results / "shards")
    return str(cfg.results / "studies" / "shards" / shard_key(values))


@dataclass(frozen=True, kw_only=True)
class PlannedPoint:
    """What the workflow needs of a point at parse time."""

    study: str
    point: Point
    shards: str
    shard_key: str
    launch: LaunchPlan

    @property
    def ranks(self) -> int:
        """Ranks on the node this job asks cores for (emulated nodes share this machine's)."""
        return self.launch.ranks


def plan(cfg: Config, study: str) -> list[PlannedPoint]:
    out = []
    for p in study_points(cfg, study):
        point_cfg = point_config(cfg, study, p)
        out.append(
            PlannedPoint(
                study=study,
                point=p,
                shards=shards_dir(cfg, point_cfg.values),
                shard_key=shard_key(point_cfg.values),
                launch=point_launch_plan(study, p, point_cfg),
            )
        )
    return out


def study_shard_sources(cfg: Config, studies: Sequence[str]) -> dict[str, tuple[str, str]]:
    """shard key -> (study, point) whose config makes those shards, for the keys that are not
    the base run's."""
    sources: dict[str, tuple[str, str]] = {}
    base = str(cfg.results / "shards")
    for study in studies:
        for planned in plan(cfg, study):
            if planned.shards != base:
                sources.setdefault(planned.shard_key, (study, planned.point.name))
    return sources


# ---------------------------------------------------------------------------------------------
# Gather


def gather(
    cfg: Config,
    study: str,
    *,
    folder: Path,
    out_tsv: Path,
    out_png: Path,
    out_summary: Path,
    tracker: Any,
) -> list[dict[str, Any]]:
    """Rows of every point -> TSV, plot, report section; the study's MLflow run (`tracker`)
    gets them as artifacts and becomes the parent of the points' training runs."""
    from cosmocub.evaluation.report import format_study_section

    defn = definition(study)
    rows: list[dict[str, Any]] = []
    per_point: dict[str, tuple[PointOutputs, list[dict[str, Any]]]] = {}
    for p in study_points(cfg, study):
        outputs = PointOutputs(point=p, folder=Path(folder) / p.name)
        recorded = (outputs.folder / POINT_FILE).is_file()
        if recorded and (skipped := outputs.record().get("skipped")):
            # Not run here (e.g. emulated nodes without CAP_NET_ADMIN): its labels, blank
            # measurements, and why in the `skipped` column.
            rows.append({"point": p.name, **p.labels, "skipped": skipped})
            continue
        point_rows = [{"point": p.name, **p.labels, **r} for r in defn.rows(outputs, cfg)]
        per_point[p.name] = (outputs, point_rows)
        rows += point_rows
    rows = defn.finish(rows, cfg) if defn.finish else rows
    write_tsv(rows, ("point", *defn.columns), out_tsv)
    defn.plot(rows, out_png)
    note = conditions_note(rows, cfg.studies)
    text = format_study_section(
        title=f"Study `{study}`",
        description=" ".join(filter(None, (defn.description, note))),
        rows=rows,
        columns=("point", *defn.columns),
        plot=out_png.name,
    )
    if defn.extra_section and (extra := defn.extra_section(rows, cfg)):
        text += "\n" + extra
    with atomic_path(out_summary) as tmp:
        tmp.write_text(text)
    for path in (out_tsv, out_png, out_summary):
        tracker.log_artifact(path, artifact_path=f"{study}_study")
    _adopt_point_runs(tracker, study, per_point, defn)
    return rows


def _adopt_point_runs(
    tracker: Any,
    study: str,
    per_point: Mapping[str, tuple[PointOutputs, list[dict[str, Any]]]],
    defn: StudyDefinition,
) -> None:
    """Make each point's training run a child of the study's run and log the point's numbers on
    it, under the same names for every point."""
    run_id = getattr(tracker, "run_id", None)
    if run_id is None:
        return  # tracking disabled
    for name, (outputs, rows) in per_point.items():
        child = outputs.train_summary().get("mlflow_run_id")
        if not child:
            log.warning("study %s point %s: its training run was not tracked", study, name)
            continue
        metrics = {
            f"study.{key}": float(value)
            for key, value in defn.point_metrics(rows).items()
            if value is not None and math.isfinite(value)
        }
        tracker.adopt(
            child, tags={"cosmocub.study": study, "cosmocub.point": name}, metrics=metrics
        )


# Per-step means of the training loop's columns (cosmocub.train.comm_meter) and their names here.
STEP_COLUMNS = {
    "compute_s": "time_compute_s",
    "exchange_s": "time_exchange_s",
    "momentum_sync_s": "time_momentum_sync_s",
    "halo_s": "time_halo_s",  # compute_s excludes it (cosmocub.train.comm_meter)
    "comm_bytes_per_step": "comm_bytes_per_step",
    "halo_bytes_per_step": "halo_bytes_per_step",
}


def training_row(outputs: PointOutputs) -> dict[str, Any]:
    """A point's training as one row: mesh, cores per rank, steps, and per-step means of the
    step's parts over the epochs after the first (which holds start-up costs) when there are
    several, weighted by their steps; step_s is their sum (data loading excluded); then the
    machine's conditions (cosmocub.contention.marks.CONDITION_COLUMNS).
    exchange_exposed_s is exchange_s (what the step waited for its exchange: under DDP
    overlapped the part left after backward), named beside exchange_busy_s, how long the
    exchange ran (blank for runs from before it was recorded)."""
    summary, record = outputs.train_summary(), outputs.record()
    epochs = outputs.metrics()
    if not epochs:
        raise ValueError(f"{outputs.run_dir / 'metrics.jsonl'}: no epochs recorded")
    row: dict[str, Any] = {
        "world_size": summary["world_size"],
        "data": summary["data_parallel"],
        "spatial": summary["spatial_parallel"],
        "nodes": record.get("nodes", 1),
        "ranks_per_node": record.get("ranks_per_node"),
        "cores_per_rank": record.get("cores_per_rank"),
        "steps": summary["steps"],
        "final_val_loss": epochs[-1].get("val_loss"),
    }
    for name, key in STEP_COLUMNS.items():
        # A part the run did not time (no halo without a spatial split, say) took no time.
        row[name] = step_weighted_mean_after_first(epochs, key, missing=0.0)
    row["step_s"] = row["compute_s"] + row["exchange_s"] + row["momentum_sync_s"] + row["halo_s"]
    row["exchange_exposed_s"] = row["exchange_s"]
    row["exchange_busy_s"] = step_weighted_mean_after_first(epochs, "time_exchange_busy_s")
    for part in ("intra", "inter"):  # comm_bytes_per_step's parts (blank for older runs)
        key = f"comm_bytes_{part}_per_step"
        row[key] = step_weighted_mean_after_first(epochs, key)
    return row | condition_row(epochs, record)  # the CPU the ranks had, and the contended mark


def point_record(plan: LaunchPlan, *, cores_per_rank: int, extra: Mapping[str, Any]) -> dict:
    """point.json: the point's launch settings, the cores each rank had, the runner's report."""
    return {
        "point": plan.name,
        "labels": dict(plan.labels),
        "launch": plan.launch.as_dict(),
        "runner": plan.runner,
        "cores_per_rank": cores_per_rank,
        **dict(extra),
    }


def write_point_record(record: Mapping[str, Any], folder: Path) -> None:
    write_json(Path(folder) / POINT_FILE, record)


def step_weighted_mean_after_first(
    epochs: list[dict[str, Any]], key: str, *, missing: float | None = None
) -> float | None:
    """Step-weighted mean of a per-epoch column over the epochs after the first (which holds
    start-up costs), or over the first alone when no later epoch has the column; None when no
    epoch has it. With `missing` set, an epoch without the column counts as that value."""
    if missing is not None:
        epochs = [{**e, key: e.get(key, missing)} for e in epochs]
    steps = [b["step"] - a for a, b in zip([0] + [e["step"] for e in epochs], epochs, strict=False)]
    use = [i for i in range(1, len(epochs)) if key in epochs[i]] or [
        i for i in range(len(epochs)) if key in epochs[i]
    ]
    total = sum(steps[i] for i in use)
    return sum(epochs[i][key] * steps[i] for i in use) / total if total else None
