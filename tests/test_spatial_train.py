"""Hybrid data × spatial training on gloo with real processes (torchrun): data=2 × spatial=2
follows data=4 × spatial=1 on the same global batches, and a spatial=2 run resumes exactly."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from shard_fixtures import make_random_shards

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.model_factory import load_model_file

pytestmark = pytest.mark.slow

TINY: dict[str, Any] = {
    "preprocess": {"sample_size": 8, "slab_depth": 2},
    "model": {
        "input_size": 8,
        "base_filters": 4,
        "num_conv_blocks": 2,
        "dense_sizes": [16],
        "dropout": 0.0,
    },
    "optimizer": {"name": "adamw", "lr": 0.003, "base_batch_size": 8, "warmup_epochs": 0},
    "train": {
        "epochs": 2,
        "augment": False,  # the schema's default is on; these runs compare layouts, not symmetries
        "checkpoint_every_steps": 3,
        "log_every_steps": 1,
        "threads_per_rank": 1,
        "deterministic": True,
    },
    "tracking": {"enabled": False},
}

# Several trainings one after another in one process group (process start-up is the cost).
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from cosmocub.config import load_config
    from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
    from cosmocub.train.main import train
    shards, runs = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    # The process group every run trains in: `train` leaves a group it did not start open (one
    # that starts and ends its own could not start a second in the same attempt's store).
    world = build_parallel_dims()

    for run in runs:
        if (Path(run["dir"]) / "train_summary.json").exists():
            continue  # finished before a rank died in a later run: this is torchrun's restart

        def hook(step, model, die_at=run["die_at"]):
            if first_attempt and os.environ["RANK"] == "1" and step == die_at:
                os._exit(17)  # a rank dies without cleaning up; torchrun restarts every rank

        if os.environ["RANK"] == "0":  # the runs' log lines (rank 0's) apart: see run_trainings
            print(f"=== training {run['name']}", file=sys.stderr, flush=True)
        train(load_config(run["config"]), shards_dir=shards, run_dir=run["dir"], on_step_end=hook)
    close_parallel_dims(world)
    """
)
MARK = "=== training "  # the line RANK_SCRIPT's rank 0 prints before each run


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shards")
    return make_random_shards(folder, counts={"train": 16, "val": 8}, size=8, slab_depth=2)


def tiny(**sections: dict) -> dict[str, Any]:
    """TINY with each of `sections` updated."""
    values = json.loads(json.dumps(TINY))
    for section, changes in sections.items():
        values.setdefault(section, {}).update(changes)
    return values


def run_trainings(
    tmp: Path,
    shards: Path,
    runs: dict[str, dict[str, Any]],
    *,
    nproc: int,
    die_at: dict[str, int] | None = None,
) -> dict[str, Path]:
    """One torchrun of `nproc` gloo ranks that trains `runs` ({name: config values}) in order,
    each into tmp/<name>; returns {name: run folder}, each with its part of the log (rank 0's
    lines from its start to the next run's) in stderr.txt. In run `name` of die_at, rank 1 dies
    at step die_at[name] of the first attempt; torchrun restarts every rank, which skip the runs
    that finished and resume that one from its checkpoint."""
    die_at = die_at or {}
    manifest = []
    for name, values in runs.items():
        cfg_path = tmp / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(values))
        (tmp / name).mkdir(exist_ok=True)
        manifest.append(
            {
                "name": name,
                "config": str(cfg_path),
                "dir": str(tmp / name),
                "die_at": die_at.get(name, 0),
            }
        )
    manifest_path = tmp / f"trainings-{'-'.join(runs)}.json"
    manifest_path.write_text(json.dumps(manifest))
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    args = [str(script), str(shards), str(manifest_path)]
    argv = torchrun_argv(nproc, *args, max_restarts=1 if die_at else 0)
    proc = multirank.run_ranks(argv, timeout=240 * len(runs))
    assert proc.returncode == 0, proc.stderr[-4000:]
    logs: dict[str, list[str]] = {name: [] for name in runs}
    current = None
    for line in proc.stderr.splitlines(keepends=True):
        if line.startswith(MARK):
            current = line.removeprefix(MARK).strip()
        elif current is not None:
            logs[current].append(line)
    for name, lines in logs.items():
        (tmp / name / "stderr.txt").write_text("".join(lines))
    return {name: tmp / name for name in runs}


def step_losses(run: Path) -> dict[int, float]:
    """Per-step global losses from rank 0's log lines (log_every_steps = 1)."""
    losses = {}
    for line in (run / "stderr.txt").read_text().splitlines():
        words = line.split()
        if words[:1] == ["step"] and "loss" in words:
            losses[int(words[1])] = float(words[words.index("loss") + 1])
    return losses


def epoch_records(run: Path) -> list[dict[str, float]]:
    """What a run computed per epoch (losses, metrics, lr), without its timings and traffic."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if computed(k)} for x in lines]


def computed(key: str) -> bool:
    return key in ("epoch", "step", "train_loss", "lr") or key.startswith("val_")


def test_data2_spatial2_matches_data4(shards: Path, tmp_path: Path) -> None:
    # The same global batch of 8: 4 data ranks × 2, or 2 data ranks × 4 (each split in two).
    # Batch norm normalises over the global batch in both.
    model = {"batch_norm": True}
    runs = {
        "data4": tiny(train={"local_batch_size": 2}, model=model),
        "data2_spatial2": tiny(train={"local_batch_size": 4}, parallel={"spatial": 2}, model=model),
    }
    flat, split = run_trainings(tmp_path, shards, runs, nproc=4).values()
    summary = json.loads((split / "train_summary.json").read_text())
    assert (summary["data_parallel"], summary["spatial_parallel"], summary["steps"]) == (2, 2, 4)
    flat_losses, split_losses = step_losses(flat), step_losses(split)
    assert sorted(flat_losses) == sorted(split_losses) == [1, 2, 3, 4]
    for step, loss in flat_losses.items():
        # The log line prints 5 decimals.
        assert split_losses[step] == pytest.approx(loss, rel=1e-4, abs=2e-5), step
    for a, b in zip(epoch_records(flat), epoch_records(split), strict=True):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    # What spatial=2 saved is the plain CosmoFlow, loadable on one process.
    a = load_model_file(flat / "model.pt")
    b = load_model_file(split / "model.pt")
    assert type(b) is CosmoFlow
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(0)  # the config's seed: the weights every rank started from
    initial = CosmoFlow(a.config)
    assert not torch.allclose(a.head.output.weight, initial.head.output.weight, atol=1e-4)


def test_spatial2_resumes_exactly(shards: Path, tmp_path: Path) -> None:
    sections = {
        "parallel": {"spatial": 2},
        "train": {"local_batch_size": 4, "augment": True},
        "model": {"batch_norm": True, "dropout": 0.3},
    }
    # Rank 1 dies at step 5 of 8 of `broken`, after the checkpoint at step 3; torchrun restarts
    # both, which resume it (`whole` trained before, in the first attempt).
    runs = {"whole": tiny(**sections), "broken": tiny(**sections)}
    whole, broken = run_trainings(tmp_path, shards, runs, nproc=2, die_at={"broken": 5}).values()
    summary = json.loads((broken / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith("step_00000003.pt") and summary["steps"] == 8
    assert (summary["world_size"], summary["spatial_parallel"]) == (2, 2)
    a = torch.load(whole / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(broken / "model.pt", weights_only=True)["state_dict"]
    plain = CosmoFlow(load_model_file(whole / "model.pt").config)
    assert a.keys() == b.keys() == plain.state_dict().keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert epoch_records(whole) == epoch_records(broken)
