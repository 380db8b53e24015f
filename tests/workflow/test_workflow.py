"""The Snakemake workflow: dry runs for every shipped config, lint, and a tiny real run."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from conftest import snakemake_env
from shard_fixtures import write_public_universes

from cosmocub.config import load_config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def snakemake(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = snakemake_env()
    env.pop("COSMOCUB_PARENT_RUN_ID", None)
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def job_counts(stdout: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    counts, in_table = {}, False
    for line in stdout.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if parts and parts[0] == "total":
                break
            if len(parts) == 2 and parts[0].isidentifier() and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
    return counts


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # 48 universes made 100 to a job (cluster.simulate.universes_per_job): one group, and no
        # job of one universe.
        (
            "config.yaml",
            {
                "universe_group": 1,
                "preprocess_group": 1,
                "preprocess": 1,
                "train": 1,
                "evaluate": 1,
            },
        ),
        (
            "test.yaml",
            {
                "universe_group": 1,
                "preprocess_group": 1,
                "preprocess": 1,
                "train": 1,
                "evaluate": 1,
            },
        ),
    ],
)
def test_dry_run(tmp_path, config, expected):
    proc = snakemake("-n", "-p", "--configfile", str(REPO / "config" / config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    for rule, n in expected.items():
        assert counts.get(rule) == n, (rule, counts)
    assert_every_command_names_its_config(proc.stdout)


# The package commands a rule runs without a config: they read only the paths they are given.
READ_NO_CONFIG = {"perf-model fit", "summarize"}


def assert_every_command_names_its_config(stdout: str) -> None:
    """Every cosmocub command a dry run prints (`-p`) names the config it runs with (--config,
    or a study point's --point-config), so it runs by hand as the workflow runs it; a command
    without one runs on the schema's defaults (a rule for a study's own seeds once did: the
    known-answer study's seeds asked for groups its 48 default universes do not have)."""
    command = r"^Shell command: .*?cosmocub ([a-z][a-z-]*(?: [a-z][a-z-]*)?)(.*)$"
    commands = re.findall(command, stdout, re.M)
    assert commands, stdout[-2000:]
    bare = [
        name
        for name, rest in commands
        if not re.search(r"--(point-)?config ", rest) and name not in READ_NO_CONFIG
    ]
    assert not bare, f"cosmocub commands without --config: {sorted(set(bare))}"


def config_in_effect(output: str) -> tuple[str, str]:
    """(hash, config files) from the workflow's 'cosmocub config <hash>: <files> + schema
    defaults' line."""
    found = re.search(r"cosmocub config ([0-9a-f]{12}): (.*) \+ schema defaults", output)
    assert found, output[-2000:]
    return found.group(1), found.group(2)


@pytest.mark.parametrize(
    "config", ["config.yaml", "test.yaml", "cosmoflow-mlperf.yaml", "science.yaml"]
)
def test_given_config_is_that_file_plus_schema_defaults(tmp_path, config):
    """From the repository root, where config/config.yaml exists: a --configfile must not be
    deep-merged over it (config/test.yaml used to get its batch norm and augmentation)."""
    path = REPO / "config" / config
    args, overrides = ["-n", "--configfile", str(path)], None
    if config == "cosmoflow-mlperf.yaml":
        public = write_public_universes(tmp_path / "public")
        args += ["--config", f"universes={{source: cosmoflow, cosmoflow_dir: {public}}}"]
        overrides = {"universes": {"source": "cosmoflow", "cosmoflow_dir": str(public)}}
    proc = snakemake(*args, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Only the given file: the embedded default's values equal the schema's today, so the hash
    # alone would not show a merge.
    expected = (load_config(path, overrides).hash, str(path))
    assert config_in_effect(proc.stdout + proc.stderr) == expected
    if config == "config.yaml":  # and without --configfile, the embedded default
        plain = snakemake("-n", cwd=REPO)
        expected = (load_config(path).hash, "config/config.yaml")
        assert config_in_effect(plain.stdout + plain.stderr) == expected


def test_dry_run_mlperf_links_public_universes(tmp_path):
    public = write_public_universes(tmp_path / "public")
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "cosmoflow-mlperf.yaml"),
        "--config",
        f"universes={{source: cosmoflow, cosmoflow_dir: {public}}}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert counts.get("link_group") == 1 and "universe_group" not in counts, counts
    # 3 universes, 2 a group: two link groups, and the preprocess groups are the same two.
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "cosmoflow-mlperf.yaml"),
        "--config",
        f"universes={{source: cosmoflow, cosmoflow_dir: {public}}}",
        "cluster={preprocess: {universes_per_job: 2}}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert (counts.get("link_group"), counts.get("preprocess_group")) == (2, 2), counts


def test_empty_public_folder_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "cosmoflow-mlperf.yaml"),
        "--config",
        f"universes={{source: cosmoflow, cosmoflow_dir: {tmp_path / 'empty'}}}",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "holds no univ_*.hdf5 files" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("target", "change", "says"),
    [
        # Read at parse time: the checker's line alone, last, no frames of common.smk.
        ("all", {"train": {"epochs": -1}}, "key 'train.epochs': -1 is less than the minimum of 1"),
        # Read while the DAG is built (the unet run's request): the same, naming the file.
        (
            "unet",
            {
                "unet": {
                    "parallel": {"spatial": 16, "split": [1, 1, 16]},
                    "train": {"ranks_per_node": 16},
                }
            },
            "width extent 8 does not divide into 16 blocks (split [1, 1, 16], input 8, depth 2)",
        ),
    ],
)
def test_a_config_mistake_is_one_line_without_frames(tmp_path, target, change, says):
    import yaml

    values = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    for section, items in change.items():
        values[section].update(items)
    values["results"] = str(tmp_path / "results")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(values))
    proc = snakemake("-n", target, "--configfile", str(tmp_path / "bad.yaml"), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and 'File "' not in out, out[-3000:]
    lines = [line for line in out.splitlines() if says in line]
    assert len(lines) == 1, out[-3000:]
    where = f"{tmp_path / 'bad.yaml'}{' + unet' if target == 'unet' else ''}"
    assert f"cosmocub: error: {where}: key " in out.strip().splitlines()[-1], out[-3000:]
    assert out.strip().splitlines()[-1].endswith(says), out[-3000:]


def _validate_inputs(stdout: str) -> list[str]:
    block = stdout.split("rule perf_model_validate:", 1)[1]
    line = next(x for x in block.splitlines() if x.strip().startswith("input:"))
    return [p.strip() for p in line.split(":", 1)[1].split(",")]


def test_perf_model_validates_on_the_study_tables_the_same_invocation_makes(tmp_path):
    """`snakemake network_study scaling_study perf_model` from empty results: the validation
    waits for both tables (it used to see only those that existed when the Snakefile was
    parsed); `perf_model` alone does not make the studies run."""
    config = str(REPO / "config" / "test.yaml")
    both = snakemake(
        "-n", "network_study", "scaling_study", "perf_model", "--configfile", config, cwd=tmp_path
    )
    assert both.returncode == 0, both.stderr[-2000:]
    tables = [p for p in _validate_inputs(both.stdout) if p.endswith("points.tsv")]
    assert [Path(p).parent.name for p in tables] == ["step_time", "network", "scaling"]
    alone = snakemake("-n", "perf_model", "--configfile", config, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-2000:]
    tables = [p for p in _validate_inputs(alone.stdout) if p.endswith("points.tsv")]
    assert [Path(p).parent.name for p in tables] == ["step_time"]
    assert "network_study" not in job_counts(alone.stdout)


def test_known_answer_seeds_make_their_own_universes_and_shards(tmp_path):
    """known_answer_study.seeds: a seed other than the config's simulates its own universes
    (its own group manifests, universes/groups/seed<s>-<g>.json) into study shards of its own;
    the config's seed uses the base's.
    Every job names its config."""
    proc = snakemake(
        "-n",
        "-p",
        "known_answer_study",
        "--configfile",
        str(REPO / "config" / "known_answer.yaml"),
        "--config",
        "known_answer_study={seeds: [0, 3]}",
        "universes={count: 20}",
        "preprocess={splits: {train: 10, val: 5, test: 5}}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = job_counts(proc.stdout)
    # 20 universes of each seed in one group each (100 a job): two jobs make all 40.
    assert counts["universe_group"] == 2 and counts["study_point"] == 2, counts
    assert counts["preprocess"] == 1 and counts["study_preprocess"] == 1, counts
    assert re.search(r"simulate-group --config \S+ --seed 3 --group 0", proc.stdout)
    assert_every_command_names_its_config(proc.stdout)
    assert "universes/groups/seed3-0.json" in proc.stdout


def test_lint_is_clean(tmp_path):
    proc = snakemake("--lint", cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command(tmp_path):
    readme = (REPO / "README.md").read_text()
    extracted = subprocess.run(
        [
            "awk",
            "/^Run the tests:/{found=1} found && /^```bash/{getline; print; exit}",
            "README.md",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the install, then pytest (in the two workers the README explains)
    assert extracted.endswith("&& pytest -n 2 --dist loadscope")
    assert extracted in readme
    assert "constraints/cpu.txt" in extracted
    ci = (REPO / ".ci" / "run").read_text()
    assert "README.md" in ci and "Run the tests:" in ci


@pytest.mark.slow
def test_tiny_pipeline_end_to_end_with_tracking(tmp_path):
    """simulate → preprocess → train → evaluate → summary, every job a child run in MLflow."""
    from mlflow.tracking import MlflowClient

    proc = snakemake(
        "--cores", "2", "--configfile", str(REPO / "config" / "test.yaml"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results-test"

    manifest = json.loads((results / "shards/manifest.json").read_text())
    # 6 universes of 16³ cut into 8³ crops: 8 samples each, split by universe 3/2/1.
    assert manifest["counts"] == {"train": 24, "val": 16, "test": 8}
    with h5py.File(results / "shards/train.h5") as f:
        assert f["x"].shape == (24, 4, 8, 8, 8)
    assert len(list((results / "universes").glob("synth_*.hdf5"))) == 6

    metrics = json.loads((results / "runs/test/eval/metrics.json").read_text())
    assert set(metrics["per_parameter"]) == {"Omega_m", "sigma_8", "N_spec", "H_0"}
    assert metrics["num_samples"] == 8
    summary = (results / "report/summary.md").read_text()
    assert "| test | 1 | 8 |" in summary and "| sigma_8 |" in summary
    # The front page leads with CNN ÷ best classical, P(k) beside it.
    assert "**CNN ÷ best classical** | CNN ÷ P(k) |" in summary
    assert set(metrics["comparison"]["per_universe"]["sigma_8"]) >= {"cnn", "pk", "cnn_over_pk"}

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cosmocub-test")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    rules = sorted(r.data.tags.get("rule") for r in children)
    # 6 universes are one universe group (cluster.simulate.universes_per_job 100) and one
    # preprocess group (cluster.preprocess.universes_per_job 100) + gather.
    assert rules == ["evaluate", "preprocess", "preprocess_group", "train", "universe_group"]
    # The preprocessing jobs' runs (records, system metrics being off) with what they logged.
    group_run = next(r for r in children if r.data.tags["rule"] == "preprocess_group")
    assert group_run.data.params["group"] == "0" and group_run.info.status == "FINISHED"
    gather_run = next(r for r in children if r.data.tags["rule"] == "preprocess")
    assert gather_run.data.metrics["samples_train"] == 24
    train_run = next(r for r in children if r.data.tags["rule"] == "train")
    assert train_run.data.params["train.epochs"] == "2"
    assert "val_loss" in train_run.data.metrics
    history = client.get_metric_history(train_run.info.run_id, "val_loss")
    assert len(history) == 2
    simulate_tags = {
        r.data.tags["wildcards"] for r in children if r.data.tags["rule"] == "universe_group"
    }
    assert simulate_tags == {"master=1,group=0"}

    # A second invocation finds nothing to do.
    again = snakemake(
        "--cores", "2", "--configfile", str(REPO / "config" / "test.yaml"), cwd=tmp_path
    )
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr

    # The HTML report gathers the plots and metrics.
    report = snakemake(
        "--report", "report.html", "--configfile", str(REPO / "config" / "test.yaml"), cwd=tmp_path
    )
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    html = (tmp_path / "report.html").read_text()
    assert "pred_vs_true.png" in html and "loss_curves.png" in html and "summary.md" in html

    # A new training setting reruns training and what follows it, never the simulations.
    changed = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "test.yaml"),
        "--config",
        "train={run_name: test, epochs: 3}",
        cwd=tmp_path,
    )
    assert changed.returncode == 0, changed.stderr
    assert job_counts(changed.stdout) == {"train": 1, "evaluate": 1, "summary_report": 1, "all": 1}
    # A change to the section evaluation alone reads reruns it alone (and what follows it); one
    # to a section no rule names (the MLflow experiment) reruns nothing.
    for change, expected in (
        ("evaluate={batch_size: 4}", {"evaluate": 1, "summary_report": 1, "all": 1}),
        ("tracking={experiment: renamed, system_metrics: false}", {}),
    ):
        config = str(REPO / "config/test.yaml")
        dry = snakemake("-n", "--configfile", config, "--config", change, cwd=tmp_path)
        assert dry.returncode == 0, dry.stderr
        assert job_counts(dry.stdout) == expected, (change, dry.stdout[-2000:])

    check_printed_commands_run_by_hand(tmp_path, results)


def printed_commands(tmp_path: Path, *rules: str) -> dict[str, str]:
    """The shell command `snakemake -p` prints for each rule's job (a dry run forcing them)."""
    config = str(REPO / "config/test.yaml")
    dry = snakemake("-n", "-p", "--forcerun", *rules, "--configfile", config, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    found = re.findall(r"Shell command: (.*)", dry.stdout + dry.stderr)
    out = {rule: [c for c in found if f"COSMOCUB_RULE={rule} " in c] for rule in rules}
    assert all(len(c) == 1 for c in out.values()), found
    return {rule: c[0] for rule, c in out.items()}


def check_printed_commands_run_by_hand(tmp_path: Path, results: Path) -> None:
    """The train and evaluate jobs' printed commands, run by hand in the same folder with no
    COSMOCUB_* variable set, do the jobs' work with the jobs' config (not the schema's
    defaults): the same evaluation to the last digit, a training with the same config hash."""
    commands = printed_commands(tmp_path, "train", "evaluate")
    assert all("--config " in c for c in commands.values()), commands
    env = {k: v for k, v in snakemake_env().items() if not k.startswith("COSMOCUB_")}
    run = results / "runs/test"
    by_workflow = json.loads((run / "eval/metrics.json").read_text())
    shutil.rmtree(run / "eval")
    done = subprocess.run(commands["evaluate"], shell=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, (results / "logs/evaluate/test.log").read_text()[-3000:]
    assert (
        json.loads((run / "eval/metrics.json").read_text())["per_parameter"]
        == (by_workflow["per_parameter"])
    )
    workflow_summary = json.loads((run / "train_summary.json").read_text())
    shutil.move(run, results / "runs/test-by-workflow")
    done = subprocess.run(commands["train"], shell=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, (results / "logs/train/test.log").read_text()[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["config_hash"] == workflow_summary["config_hash"]
    assert summary["config_hash"] != load_config(None).hash  # not the defaults
    assert (summary["world_size"], summary["steps"]) == (
        workflow_summary["world_size"],
        workflow_summary["steps"],
    )


def test_dry_run_lion_cub_by_config(tmp_path):
    """Nested optimizer options pass Snakemake's own schema validation (it fills defaults too)."""
    options = (
        "{name: lion_cub, lion_cub: {quantizer: l1, bits: 4, collective: allreduce,"
        " momentum_sync: {schedule: every, every_steps: 10, patterns: [head.*]}}}"
    )
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "test.yaml"),
        "--config",
        f"optimizer={options}",
        "train={ranks_per_node: 4}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout).get("train") == 1
    bad = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "test.yaml"),
        "--config",
        "optimizer={name: lion, lion_cub: {quantizer: l1}}",
        cwd=tmp_path,
    )
    assert bad.returncode != 0 and "optimizer.lion_cub" in bad.stderr + bad.stdout


def test_raising_universes_count_by_a_group_makes_only_that_group(tmp_path):
    """universes.count 4 → 6 at 2 universes a group: the third group's job alone runs, the
    first two groups' universes and manifests stay as they were (not remade, not touched); a
    change to the simulate settings makes every group again."""
    config = str(REPO / "config" / "test.yaml")
    group = "cluster={simulate: {universes_per_job: 2}}"
    groups = tmp_path / "results-test" / "universes" / "groups"

    def targets(n: int) -> list[str]:  # relative to the working directory, as rules name them
        return [f"results-test/universes/groups/seed1-{g}.json" for g in range(n)]

    first = snakemake(
        "--cores",
        "2",
        *targets(2),
        "--configfile",
        config,
        "--config",
        "universes={count: 4}",
        group,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    made = sorted((tmp_path / "results-test" / "universes").glob("*.hdf5"))
    assert [p.name for p in made] == [f"synth_{1_000_000 + i}.hdf5" for i in range(4)]
    before = {p: p.stat().st_mtime_ns for p in [*made, *groups.glob("*.json")]}

    more = ["--configfile", config, "--config", "universes={count: 6}", group]
    dry = snakemake("-n", *targets(3), *more, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert job_counts(dry.stdout) == {"universe_group": 1}, dry.stdout[-2000:]
    assert "--group 2 " in dry.stdout and "--group 0 " not in dry.stdout
    second = snakemake("--cores", "2", *targets(3), *more, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in before} == before
    listed = json.loads((groups / "seed1-2.json").read_text())["universes"]
    assert [u["seed"] for u in listed] == [1_000_004, 1_000_005]

    # Another simulate setting: every group is made again (its job's --config changes).
    changed = snakemake("-n", *targets(3), *more, "simulate={pm_steps: 5}", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr[-2000:]
    assert job_counts(changed.stdout) == {"universe_group": 3}, changed.stdout[-2000:]


def test_the_real_mlperf_samples_run_to_a_report(tmp_path, real_samples):
    """The three real samples in the MLPerf layout (one in train/, two universes in
    validation/, which the source shares out between val and test) through the whole
    workflow: its shards hold exactly the counts `cosmocub inspect` reads, log1p'd."""
    import numpy as np

    from cosmocub.data.tfrecord import read_tfrecord

    train, *validation = sorted(real_samples, key=lambda p: "a10018182" not in p.name)
    layout = tmp_path / "mlperf"
    for folder, files in (("train", [train]), ("validation", validation)):
        (layout / folder).mkdir(parents=True)
        for f in files:
            (layout / folder / f.name).symlink_to(f)
    proc = snakemake(
        "--cores",
        "2",
        "--configfile",
        str(REPO / "config" / "test.yaml"),
        "--config",
        f"universes={{source: mlperf, mlperf_dir: {layout}}}",
        "preprocess={sample_size: 32, slab_depth: 8}",
        "train={epochs: 1, run_name: real}",
        "model={input_size: 32, base_filters: 4, num_conv_blocks: 2, dense_sizes: [16]}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    shards = tmp_path / "results-test" / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["counts"] == {"train": 64, "val": 64, "test": 64}
    assert manifest["source_universes"]["universes_in_two_splits"] == 0
    for split in ("train", "val", "test"):
        with h5py.File(shards / f"{split}.h5") as f:
            (source,) = json.loads(f.attrs["source_files"])
            counts, label, _ = read_tfrecord(source)
            for i in (0, 37, 63):
                d, h, w = f["crop_origin"][i]
                crop = counts[d : d + 32, h : h + 32, w : w + 32].astype(np.float32)
                expected = np.log1p(crop).astype(np.float16).transpose(3, 0, 1, 2)
                assert f["x"][i].tobytes() == expected.tobytes(), (split, i)
            np.testing.assert_array_equal(f["y"][0], label)
    summary = (tmp_path / "results-test" / "report" / "summary.md").read_text()
    assert "no universe has crops in two splits" in summary
