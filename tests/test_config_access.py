"""A job reads only what its config's hash covers: each job's --config holds the sections its
rule lists alone (cosmocub.config.held), and a stage reading another key fails with its name.
The rules are those the workflow itself makes jobs of, in dry runs of every target it lists;
every one of their stages runs on its held config in the `long` test at the end.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import snakemake_env
from shard_fixtures import write_public_universes

from cosmocub.config import ConfigError, load_config
from cosmocub.config.held import RECORD_SECTIONS

REPO = Path(__file__).resolve().parents[1]
TEST_CONFIG = REPO / "config" / "test.yaml"
# A job's block in a dry run's -p output: its rule, then (further down) its shell command.
JOB = re.compile(r"^(?:local)?rule (\w+):\n(?:(?!\n\n).)*?^Shell command: ([^\n]*)", re.M | re.S)
# The config a `cosmocub` command names (a study point's, --point-config).
CONFIG_ARG = re.compile(r"cosmocub [a-z].*?--(?:point-)?config (\S+)")


def snakemake(*args: str, cwd: Path, snakefile: Path = REPO / "Snakefile"):
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(snakefile), *args]
    env = snakemake_env()
    env.pop("COSMOCUB_PARENT_RUN_ID", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def listed(*args: str) -> list[str]:
    proc = snakemake(*args, "--configfile", str(TEST_CONFIG), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def mlperf_layout(root: Path) -> Path:
    """The MLPerf TFRecord folders, a sample of 16³ a file (an mlperf_group job reads them)."""
    from cosmocub.data.tfrecord import encode_example, frame_record

    rng = np.random.default_rng(0)
    for i, folder in enumerate(("train", "validation", "validation")):
        x = rng.poisson(1.0, (16, 16, 16, 4)).astype(np.int16)
        record = frame_record(encode_example(x, np.full(4, 0.1 * i, np.float32)))
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / f"univ_a{i}_000.tfrecord").write_bytes(gzip.compress(record, mtime=0))
    return root


def sources(tmp_path: Path) -> dict[str, dict]:
    """The configs (overrides of config/test.yaml) whose dry runs, between them, make a job of
    every rule: universes made here, public ones (link_group) and MLPerf ones (mlperf_group)."""
    public = write_public_universes(tmp_path / "public_files", size=16)
    mlperf = mlperf_layout(tmp_path / "mlperf_files")
    return {
        "made_here": {},
        "public": {"universes": {"source": "cosmoflow", "cosmoflow_dir": str(public)}},
        "mlperf": {"universes": {"source": "mlperf", "mlperf_dir": str(mlperf)}},
    }


def config_args(overrides: dict) -> list[str]:
    given = [f"{key}={json.dumps(section)}" for key, section in overrides.items()]
    return ["--configfile", str(TEST_CONFIG), *(["--config", *given] if given else [])]


def fitting_targets(targets: list[str], overrides: dict) -> list[str]:
    """The targets this config plans: a study whose block does not fit it (the universes
    study's 1,000 training universes of 6) is left out, as its own target fails alone."""
    from cosmocub.workflow_support import STUDY_NAMES, planned_points

    cfg = load_config(TEST_CONFIG, overrides)
    unfit = set()
    for study in STUDY_NAMES:
        try:
            planned_points(cfg, study)
        except ValueError:
            unfit.add(f"{study}_study")
    return [t for t in targets if t not in unfit]


@pytest.fixture(scope="module")
def workflow_jobs(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """Every rule whose job runs `cosmocub` with a config, enumerated from dry runs of every
    target the workflow lists: {rule: (its config as named, the working folder)}, the first
    job of each."""
    tmp = tmp_path_factory.mktemp("jobs")
    targets = listed("--list-target-rules")
    jobs: dict[str, tuple[str, Path]] = {}
    seen: set[str] = set()
    for name, overrides in sources(tmp).items():
        (cwd := tmp / name).mkdir()
        planned = fitting_targets(targets, overrides)
        proc = snakemake("-n", "-p", *planned, *config_args(overrides), cwd=cwd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for rule, command in JOB.findall(proc.stdout):
            seen.add(rule)
            found = CONFIG_ARG.search(command)
            if found and rule not in jobs:
                jobs[rule] = (found.group(1), cwd)
    # A study's target left out everywhere plans nothing; its jobs' rules are the others'.
    unplanned = set(listed("--list-rules")) - seen - set(targets)
    assert not unplanned, f"rules no dry run here makes a job of: {sorted(unplanned)}"
    return jobs


def test_every_job_config_holds_its_rules_sections_alone(workflow_jobs) -> None:
    """Each job's --config written at parse time (results/config/sections-*.yaml) holds the
    sections its rule lists (`held`), the top-level sections they lie in and the record
    sections, nothing else; and its config refuses a read of anything else, naming the key.
    Point and U-Net configs are made by a job (study_point_config, unet_config): checked where
    they run (test_every_stage_runs_on_the_config_it_holds)."""
    assert {"universe_group", "link_group", "mlperf_group", "train", "evaluate"} <= set(
        workflow_jobs
    ), sorted(workflow_jobs)
    checked = 0
    for rule, (named, cwd) in workflow_jobs.items():
        path = cwd / named
        if not path.name.startswith("sections-"):
            continue
        values = yaml.safe_load(path.read_text())
        held = values["held"]
        tops = {key.split(".")[0] for key in held} | set(RECORD_SECTIONS)
        assert set(values) - {"held"} == tops, (rule, sorted(values))
        cfg = load_config(path)
        unheld = sorted({"seed", "universes", "train", "perf_model", "cluster"} - tops)
        with pytest.raises(ConfigError, match=rf"key '{unheld[0]}': read by this stage"):
            getattr(cfg, unheld[0])
        checked += 1
    assert checked >= 12, sorted(workflow_jobs)


def copy_workflow(to: Path) -> Path:
    """The workflow's files, to change a rule's section list without touching the repository."""
    to.mkdir()
    for name in ("Snakefile", "workflow", "envs", "profiles", "config"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, to / name)
    return to / "Snakefile"


def test_a_rule_that_lists_too_little_fails_naming_the_stage_and_key(tmp_path) -> None:
    """universe_group without universes.size in its list: its job fails at once, Snakemake
    naming the rule, its log's one line the stage, the key and the job's file; no universe is
    written."""
    snakefile = copy_workflow(tmp_path / "wf")
    rules = tmp_path / "wf" / "workflow" / "rules" / "data.smk"
    text = rules.read_text()
    assert text.count('"universes.size",\n') == 1
    rules.write_text(text.replace('"universes.size",\n', "", 1))
    work = tmp_path / "run"
    work.mkdir()
    proc = snakemake(
        "--cores",
        "1",
        "results-test/universes/groups/seed1-0.json",
        "--configfile",
        str(TEST_CONFIG),
        cwd=work,
        snakefile=snakefile,
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Error in rule universe_group:" in proc.stdout + proc.stderr  # the rule
    (line,) = (work / "results-test/logs/universes/seed1-0.log").read_text().splitlines()
    assert line.startswith("cosmocub simulate-group: error: results-test/config/sections-")
    assert "key 'universes.size': read by this stage, but its config holds only" in line
    assert not list((work / "results-test/universes").glob("*.hdf5"))


def test_the_calibration_reads_what_its_config_holds(workflow_jobs, tmp_path, monkeypatch):
    """perf_model_calibrate's stage on its job's own config, its timings stubbed (they take
    minutes, and on a busy machine its fits are refused, which is no config's doing): every
    config read it makes is guarded, and it writes the calibration where it says."""
    from calibration_fixtures import synthetic_calibration

    from cosmocub.cli import main
    from cosmocub.perfmodel.uses import entry_points

    timed = []

    def measure(settings, *, cores):
        timed.append((settings.repeats, cores))
        return synthetic_calibration()

    monkeypatch.setattr(entry_points, "measure", measure)
    named, cwd = workflow_jobs["perf_model_calibrate"]
    monkeypatch.chdir(cwd)
    out = tmp_path / "calibration.json"
    assert main(["perf-model", "calibrate", "--config", named, "--out", str(out)]) == 0
    assert timed == [(5, len(os.sched_getaffinity(0)))] and out.is_file()


# Targets that make, between them, a job of every rule on config/test.yaml's universes (but
# perf_model_calibrate's, above): the pipeline, the U-Net, the step-time study (gathered) and
# the performance model on a calibration of this machine given; one sample-size point of its
# own shards and its evaluation.
RUN_TARGETS = ("all", "unet", "step_time_study", "perf_model")
# Less work, every rule still run: one training epoch, one step-time point, links at rates
# that take no time to emulate, two message sizes timed once; and no point left out as
# contended (on a busy machine the one step-time point may be, and validation would have none).
LESS_WORK = {
    "train": {"epochs": 1},
    "studies": {"contended_ready_share": 0.001, "contended_steal_share": 0.99},
    "step_time_study": {"points": [{"name": "dp1"}]},
    "network_study": {"rates_mbit": [10000]},
    "scaling_study": {"rate_mbit": 10000},
    "perf_model": {"bench": {"sizes_bytes": [1024, 16384], "repeats": 1}},
}


def sample_size_point() -> str:
    """A sample-size point whose shards are its own (another sample size than the base's)."""
    from cosmocub.workflow_support import planned_points

    points = planned_points(load_config(TEST_CONFIG), "sample_size")
    return next(name for name, p in points.items() if "/studies/shards/" in str(p.shards))


# The workflow's full runs of studies and the U-Net are `long` (tests/workflow/
# test_spatial_workflow.py): this one takes 2.5 min on two cores, 5 when others share them.
@pytest.mark.slow
@pytest.mark.long
def test_every_stage_runs_on_the_config_it_holds(tmp_path, workflow_jobs) -> None:
    """Every rule that runs `cosmocub` with a config runs here, one job or more, each on its
    held config: a stage reading a key outside its rule's sections would fail its job."""
    from calibration_fixtures import synthetic_calibration

    from cosmocub.io import write_json

    calibration = tmp_path / "calibration.json"
    write_json(calibration, synthetic_calibration().as_dict())
    work = tmp_path / "run"
    work.mkdir()
    point = sample_size_point()  # of its own shards: study_preprocess_* and study_evaluate
    given = {
        **LESS_WORK,
        "perf_model": {**LESS_WORK["perf_model"], "calibration": {"path": str(calibration)}},
    }
    for source, overrides in sources(tmp_path).items():
        targets = {
            "made_here": [
                *RUN_TARGETS,
                f"results-test/studies/sample_size/{point}/eval/metrics.json",
            ],
            "public": ["results-test/universes/groups/public-0.json"],
            "mlperf": ["results-test/universes/groups/mlperf-0.json"],
        }[source]
        config = config_args({**given, **overrides})
        proc = snakemake("--cores", "2", *targets, *config, cwd=work)
        errors = re.findall(r"cosmocub [a-z -]+: error: .*", proc.stdout + proc.stderr)
        assert proc.returncode == 0, errors or proc.stderr[-3000:]
    logs = "".join(p.read_text() for p in (work / ".snakemake" / "log").glob("*.log"))
    ran = set(re.findall(r"\(Rule: (\w+)\)", logs))
    assert set(workflow_jobs) - ran == {"perf_model_calibrate"}, sorted(ran)
