"""Training: overfitting, bit-identical resume, 2-rank gloo run, checkpoint errors, launcher env."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from shard_fixtures import make_random_shards

from cosmocub import cli
from cosmocub.config import Config, load_config
from cosmocub.contention.probes import read_core_ticks, read_sched_ns
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.models.model_factory import load_model_file
from cosmocub.parallel.parallel_dims import (
    LaunchEnv,
    ParallelDims,
    _first_slurm_host,
    detect_launch_env,
)
from cosmocub.train.checkpoint import CheckpointManager, CheckpointMismatchError
from cosmocub.train.loaders import ResumableSampler
from cosmocub.train.loop import NonFiniteLossError
from cosmocub.train.main import train

# Tiny and plain (no batch norm, no augmentation, no decay), as these tests were written; each
# test switches on what it checks.
TINY = {
    "preprocess": {"sample_size": 8},
    "model": {
        "input_size": 8,
        "base_filters": 4,
        "num_conv_blocks": 2,
        "dense_sizes": [16],
        "batch_norm": False,
        "dropout": 0.5,
    },
    "optimizer": {
        "name": "adamw",
        "lr": 0.003,
        "base_batch_size": 4,
        "warmup_epochs": 0,
        "decay_epochs": [],
        "decay_factors": [],
    },
    "train": {
        "epochs": 3,
        "local_batch_size": 4,
        "augment": False,
        "checkpoint_every_steps": 5,
        "log_every_steps": 100,
        "threads_per_rank": 1,
    },
    "tracking": {"enabled": False},
}


def tiny_cfg(**sections: dict[str, Any]) -> Config:
    values = json.loads(json.dumps(TINY))
    for name, changes in sections.items():
        values.setdefault(name, {}).update(changes)
    return load_config(None, overrides=values)


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    return make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)


class Killed(Exception):
    pass


def kill_after(step_to_die: int):
    def hook(step: int, model: torch.nn.Module) -> None:
        if step == step_to_die:
            raise Killed(step)

    return hook


def checkpoint_dir(run: Path) -> Path:
    """The one checkpoint folder of a run trained with a single config."""
    (folder,) = (run / "checkpoints").iterdir()
    return folder


def test_outputs_follow_the_run_format(shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = train(tiny_cfg(), shards_dir=shards, run_dir=run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert [r["step"] for r in records] == [4, 8, 12]  # 16 samples / batch 4
    expected_keys = {
        "epoch",
        "step",
        "train_loss",
        "val_loss",
        "val_mae",
        "lr",
        "samples_per_s",
        "data_wait_share",
        "device_busy_share",
        "comm_bytes_per_step",
        "comm_bytes_intra_per_step",
        "comm_bytes_inter_per_step",
        "time_compute_s",
        "time_exchange_s",
        "time_exchange_busy_s",
        "time_momentum_sync_s",
        "halo_bytes_per_step",
        "time_halo_s",
        "elapsed_s",
        "peak_rss_mb",
        # What the machine gave the steps (contention/conditions.py); ready_share needs schedstat.
        *("cpu_s", "wall_s", "cpu_share", "nivcsw", "load_1m_start", "load_1m_end"),
        *("torch_threads", "cores_granted"),
        *(("ready_share",) if read_sched_ns() is not None else ()),
    } | {f"val_mae_{p}" for p in ("Omega_m", "sigma_8", "N_spec", "H_0")}
    # steal_share: where /proc/stat is, over an epoch whose cores had a core-second of work
    # (STEAL_MIN_TICKS); these epochs are shorter, so it may be absent.
    assert set(records[0]) - {"steal_share"} == expected_keys
    for record in records:
        assert "steal_share" not in record or 0.0 <= record["steal_share"] <= 1.0
    assert read_core_ticks() is not None or "steal_share" not in records[0]
    assert records[-1]["torch_threads"] == 1 and 0 < records[-1]["cpu_share"] < 1.5
    # Wall time since training start, growing with every epoch; this rank's peak memory.
    elapsed = [r["elapsed_s"] for r in records]
    assert 0 < elapsed[0] < elapsed[1] < elapsed[2]
    assert all(r["peak_rss_mb"] > 50 for r in records)
    r = records[-1]
    per_param = [r[f"val_mae_{p}"] for p in ("Omega_m", "sigma_8", "N_spec", "H_0")]
    assert r["val_mae"] == pytest.approx(sum(per_param) / 4)
    assert 0 <= r["data_wait_share"] < 1 and r["samples_per_s"] > 0
    assert r["lr"] == pytest.approx(0.003)
    # Checkpoints every 5 steps plus the final one; only the last 2 are kept, beside the values
    # the folder's hash comes from.
    assert sorted(p.name for p in checkpoint_dir(run).iterdir()) == [
        "resume.json",
        "step_00000010.pt",
        "step_00000012.pt",
    ]
    on_disk = json.loads((run / "train_summary.json").read_text())
    assert on_disk["steps"] == summary["steps"] == 12 and on_disk["world_size"] == 1
    assert on_disk["mlflow_run_id"] is None
    assert load_model_file(run / "model.pt").config == tiny_cfg().model
    # A re-run finds the final checkpoint and trains no further.
    again = train(tiny_cfg(), shards_dir=shards, run_dir=run)
    assert again["resumed_from"].endswith("step_00000012.pt") and again["steps"] == 12


def test_overfits_a_few_samples(tmp_path: Path) -> None:
    shards = make_random_shards(tmp_path / "s", counts={"train": 4, "val": 4}, size=8, seed=3)
    cfg = tiny_cfg(model={"dropout": 0.0}, optimizer={"lr": 0.005}, train={"epochs": 60})
    train(cfg, shards_dir=shards, run_dir=tmp_path / "run")
    losses = [
        json.loads(line)["train_loss"]
        for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    assert losses[-1] < losses[0] / 20, (losses[0], losses[-1])


def test_gaussian_head_trains_and_validates_its_nll(tmp_path: Path) -> None:
    shards = make_random_shards(tmp_path / "s", counts={"train": 4, "val": 4}, size=8, seed=3)
    cfg = tiny_cfg(
        model={"dropout": 0.0, "head": "gaussian"}, optimizer={"lr": 0.005}, train={"epochs": 30}
    )
    train(cfg, shards_dir=shards, run_dir=tmp_path / "run")
    records = [
        json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    # The NLL falls below what the MSE alone allows: the variances shrink on memorised samples.
    assert records[-1]["train_loss"] < records[0]["train_loss"] - 0.5
    assert all(math.isfinite(r["val_nll"]) for r in records)
    model = load_model_file(tmp_path / "run/model.pt")
    assert model.config.gaussian and model.head.output.out_features == 8


def test_deterministic_resume_is_bit_identical(shards: Path, tmp_path: Path) -> None:
    cfg = tiny_cfg(
        train={"deterministic": True, "num_data_workers": 2, "augment": True},
        model={"dropout": 0.3, "batch_norm": True},
    )
    train(cfg, shards_dir=shards, run_dir=tmp_path / "whole")
    with pytest.raises(Killed):  # dies mid-epoch 1, two steps after the checkpoint at step 5
        train(cfg, shards_dir=shards, run_dir=tmp_path / "broken", on_step_end=kill_after(7))
    assert not (tmp_path / "broken/model.pt").exists()
    resumed = train(cfg, shards_dir=shards, run_dir=tmp_path / "broken")
    assert resumed["resumed_from"].endswith("step_00000005.pt")
    whole = torch.load(tmp_path / "whole/model.pt", weights_only=True)["state_dict"]
    again = torch.load(tmp_path / "broken/model.pt", weights_only=True)["state_dict"]
    assert whole.keys() == again.keys()
    for name in whole:
        assert torch.equal(whole[name], again[name]), name

    def losses(run: str) -> list[dict[str, float]]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        # wall-clock, memory and the machine's conditions (contention/conditions.py): not
        # reproducible
        timing = ("samples_per_s", "data_wait_share", "time_", "elapsed_s", "peak_rss_mb")
        timing += ("device_busy_share",)
        timing += ("cpu_", "wall_s", "ready_share", "steal_share", "nivcsw", "load_1m")
        return [{k: v for k, v in json.loads(x).items() if not k.startswith(timing)} for x in lines]

    assert losses("whole") == losses("broken")
    # Data workers change nothing: the same run without them gives the same weights (the val
    # loader must not draw worker seeds from the global RNG that dropout uses).
    no_workers = tiny_cfg(
        train={"deterministic": True, "num_data_workers": 0, "augment": True},
        model={"dropout": 0.3, "batch_norm": True},
    )
    train(no_workers, shards_dir=shards, run_dir=tmp_path / "no_workers")
    plain = torch.load(tmp_path / "no_workers/model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(whole[name], plain[name]) for name in whole)
    # Nor does where the batches are cut: the shard held in memory (auto on a CPU: device) or
    # read by the DataLoader, the same crops from the same draws (data/resident_crops.py).
    read = tiny_cfg(
        train={"deterministic": True, "data_placement": "loader", "augment": True},
        model={"dropout": 0.3, "batch_norm": True},
    )
    train(read, shards_dir=shards, run_dir=tmp_path / "loader")
    by_loader = torch.load(tmp_path / "loader/model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(whole[name], by_loader[name]) for name in whole)


def test_checkpoint_from_other_config_is_refused(shards: Path, tmp_path: Path, caplog) -> None:
    run = tmp_path / "run"
    train(tiny_cfg(train={"epochs": 1}), shards_dir=shards, run_dir=run)
    # Operational keys may change on resume (more epochs, other logging cadence).
    train(tiny_cfg(train={"epochs": 2, "log_every_steps": 1}), shards_dir=shards, run_dir=run)
    first_folder = checkpoint_dir(run)
    first_checkpoints = sorted(p.name for p in first_folder.iterdir())
    # Another optimizer setting is another run: it starts at step 0 in a folder of its own and
    # leaves the first run's checkpoints as they were.
    other = tiny_cfg(train={"epochs": 1}, optimizer={"lr": 0.01})
    with caplog.at_level(logging.WARNING, logger="cosmocub.train.main"):
        summary = train(other, shards_dir=shards, run_dir=run)
    assert summary["resumed_from"] is None and summary["steps"] == 4
    # ... and says so, naming the keys that changed against the newest checkpoints.
    assert summary["fresh_start"] == {
        "previous": str(first_folder),
        "changed": ["optimizer.lr: 0.003 → 0.01"],
    }
    assert f"training starts at step 0 in {run / 'checkpoints'}" in caplog.text
    assert f"{first_folder}, were written with other settings: optimizer.lr: 0.003 → 0.01" in (
        caplog.text
    )
    folders = sorted((run / "checkpoints").iterdir())
    assert len(folders) == 2 and first_folder in folders
    assert sorted(p.name for p in first_folder.iterdir()) == first_checkpoints
    # A checkpoint moved by hand into another config's folder is refused, naming both hashes.
    second = next(f for f in folders if f != first_folder)
    shutil.copy(first_folder / "step_00000008.pt", second / "step_00000009.pt")
    with pytest.raises(
        CheckpointMismatchError,
        match=r"step_00000009\.pt: checkpoint written "
        r"with config hash [0-9a-f]{12}, this run has [0-9a-f]{12}",
    ):
        train(other, shards_dir=shards, run_dir=run)


def test_new_training_data_starts_a_new_run(tmp_path: Path) -> None:
    cfg = tiny_cfg(train={"epochs": 1})
    run = tmp_path / "run"
    old = make_random_shards(tmp_path / "old", counts={"train": 8, "val": 4}, size=8, seed=1)
    new = make_random_shards(tmp_path / "new", counts={"train": 8, "val": 4}, size=8, seed=2)
    train(cfg, shards_dir=old, run_dir=run)
    summary = train(cfg, shards_dir=new, run_dir=run)
    assert summary["resumed_from"] is None
    assert summary["fresh_start"]["changed"] == [
        "data: other training shards (stats or split sizes)"
    ]
    assert len(list((run / "checkpoints").iterdir())) == 2


def test_old_checkpoint_folders_are_pruned_by_the_keep_policy(shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    folders = []
    for lr in (0.001, 0.002, 0.003, 0.004):
        cfg = tiny_cfg(train={"epochs": 1, "keep_old_checkpoint_folders": 1}, optimizer={"lr": lr})
        train(cfg, shards_dir=shards, run_dir=run)
        new = set((run / "checkpoints").iterdir()) - set(folders)
        folders += sorted(new)
        # This run's folder and the newest other one; older ones are gone.
        assert set((run / "checkpoints").iterdir()) == set(folders[-2:])
    # Folders holding anything but checkpoints are never deleted.
    (folders[-2] / "notes.txt").write_text("mine")
    for lr in (0.005, 0.006):
        cfg = tiny_cfg(train={"epochs": 1, "keep_old_checkpoint_folders": 0}, optimizer={"lr": lr})
        train(cfg, shards_dir=shards, run_dir=run)
    left = set((run / "checkpoints").iterdir())
    assert folders[-2] in left and len(left) == 2


@pytest.mark.parametrize(
    ("poison_after", "nan_step"),
    [(3, 4), (2, 3)],  # (2, 3): the NaN at step 3 is only read at the checkpoint of step 4
)
def test_nan_loss_stops_and_keeps_last_good_checkpoint(
    shards: Path, tmp_path: Path, poison_after: int, nan_step: int
) -> None:
    def poison(step: int, model: torch.nn.Module) -> None:
        if step == poison_after:
            with torch.no_grad():
                model.head.output.weight.fill_(float("nan"))

    run = tmp_path / "run"
    cfg = tiny_cfg(train={"checkpoint_every_steps": 2})
    with pytest.raises(
        NonFiniteLossError,
        match=rf"training loss is nan at step {nan_step} \(epoch 0, batch {nan_step - 1}\).*"
        r"step_00000002\.pt",
    ):
        train(cfg, shards_dir=shards, run_dir=run, on_step_end=poison)
    assert sorted(p.name for p in checkpoint_dir(run).iterdir()) == [
        "resume.json",
        "step_00000002.pt",
    ]
    assert not (run / "model.pt").exists()
    state = torch.load(checkpoint_dir(run) / "step_00000002.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_shard_model_size_mismatch(shards: Path, tmp_path: Path) -> None:
    cfg = load_config(None, overrides={"tracking": {"enabled": False}})  # input_size 32
    with pytest.raises(
        ValueError,
        match=r"train\.h5: dataset 'x' holds 8³ samples but "
        r"model\.input_size is 32",
    ):
        train(cfg, shards_dir=shards, run_dir=tmp_path / "run")


def test_too_few_samples_for_a_batch(tmp_path: Path) -> None:
    shards = make_random_shards(tmp_path / "s", counts={"train": 3, "val": 2}, size=8)
    with pytest.raises(
        ValueError,
        match=r"train\.h5: 3 samples give 3 per data rank \(x1\), "
        r"fewer than train\.local_batch_size 4",
    ):
        train(tiny_cfg(), shards_dir=shards, run_dir=tmp_path / "run")


def test_tasks_own_their_layouts_and_a_unet_refuses_the_gaussian_head() -> None:
    from cosmocub.config import ConfigError
    from cosmocub.train.tasks import build_task

    unet = {
        "model": {"name": "unet", "in_channels": 1, "unet": {"depth": 2, "convs_per_level": 1}},
        "task": {"input_redshifts": [3.0], "target_redshift": 0.0},
    }
    assert build_task(tiny_cfg()).output_layout == "(B, P)"
    assert build_task(tiny_cfg(model={"head": "gaussian"})).name == "gaussian"
    assert build_task(tiny_cfg(**unet)).output_layout == "(B, 1, d, h, w)"
    with pytest.raises(ConfigError, match=r"key 'model\.head': 'gaussian' is a CosmoFlow head"):
        build_task(tiny_cfg(**{**unet, "model": {**unet["model"], "head": "gaussian"}}))


def test_resumable_sampler_positions() -> None:
    data = list(range(22))
    samplers = [
        ResumableSampler(data, num_replicas=2, rank=r, seed=5, batch_size=3) for r in (0, 1)
    ]
    for sampler in samplers:
        sampler.set_position(epoch=1)
    full = [list(s) for s in samplers]
    # 11 samples per rank → 3 full batches of 3; the ranks share nothing.
    assert [len(f) for f in full] == [9, 9] and not set(full[0]) & set(full[1])
    samplers[0].set_position(epoch=1, skip_batches=2)
    assert list(samplers[0]) == full[0][6:] and len(samplers[0]) == 3
    samplers[0].set_position(epoch=2)
    assert list(samplers[0]) != full[0]  # reshuffled per epoch


def test_checkpoint_invariants_are_checked(tmp_path: Path) -> None:
    layer = torch.nn.Linear(2, 2)
    CheckpointManager(
        tmp_path, config_hash="abc", stateful={"model": layer}, invariants={"data_parallel_size": 4}
    ).save(7)
    other = CheckpointManager(
        tmp_path, config_hash="abc", stateful={"model": layer}, invariants={"data_parallel_size": 2}
    )
    with pytest.raises(
        CheckpointMismatchError,
        match=r"step_00000007\.pt: checkpoint written "
        r"with data_parallel_size=4, this run has data_parallel_size=2",
    ):
        other.restore_latest(rank=0)


def test_growing_world_on_resume_is_said(tmp_path: Path, caplog) -> None:
    layer = torch.nn.Linear(2, 2)
    manager = CheckpointManager(tmp_path, config_hash="abc", stateful={"model": layer})
    manager.save(3)  # one rank's RNG state
    torch.manual_seed(123)
    with caplog.at_level(logging.WARNING, logger="cosmocub.train.checkpoint"):
        assert manager.restore_latest(rank=0, world_size=4) == tmp_path / "step_00000003.pt"
    assert (
        "step_00000003.pt: saved by 1 ranks, resumed by 4: ranks 1..3 take rank 0's RNG state"
        in (caplog.text)
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cosmocub.train.checkpoint"):
        manager.restore_latest(rank=0, world_size=1)
    assert caplog.text == ""


def test_cli_train_writes_run_and_reports_user_errors(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    values = json.loads(json.dumps(TINY))
    values["train"]["epochs"] = 1
    cfg_path.write_text(yaml.safe_dump(values))
    run = tmp_path / "run"
    args = ["train", "--config", str(cfg_path), "--shards", str(shards), "--out", str(run)]
    assert cli.main(args) == 0
    assert {"model.pt", "metrics.jsonl", "train_summary.json"} <= {p.name for p in run.iterdir()}
    capsys.readouterr()
    missing = tmp_path / "no-shards"
    assert cli.main([*args[:4], str(missing), *args[5:]]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{missing}/stats.json: shard statistics not found" in err

    # A world unlike the config's (here one process, no launcher, against 2 ranks a node on 3
    # nodes) is refused before anything is written: one line naming both.
    values["train"]["ranks_per_node"] = 2
    values["cluster"] = {"train": {"nodes": 3}}
    cfg_path.write_text(yaml.safe_dump(values))
    other = tmp_path / "other-world"
    assert cli.main([*args[:6], str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err == (
        f"cosmocub train: error: {cfg_path}: the launcher started 1 rank(s) (single), the "
        "config's world is 6 (cluster.train.nodes 3 × train.ranks_per_node 2)"
    )
    assert not other.exists()

    # Without a config a stage runs on the schema's defaults, and says so in one line.
    assert cli.main(["model-summary"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (
        "cosmocub model-summary: no --config: using the schema's defaults "
        "(cosmocub/schemas/config.schema.yaml)"
    )


@pytest.mark.slow
def test_metrics_reach_mlflow(shards: Path, tmp_path: Path) -> None:
    import mlflow

    cfg = tiny_cfg(
        train={"epochs": 2, "log_every_steps": 2},
        tracking={"enabled": True, "system_metrics": False},
        # Lion Cub's levels in use are a run parameter (l1 at 4 bits keeps 7 on one rank).
        optimizer={"name": "lion_cub", "lion_cub": {"quantizer": "l1", "bits": 4}},
    )
    cfg = load_config(None, overrides={**cfg.values, "results": str(tmp_path / "results")})
    summary = train(cfg, shards_dir=shards, run_dir=tmp_path / "run")
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/results/mlflow.db")
    run_id = summary["mlflow_run_id"]
    assert run_id
    val_mae = client.get_metric_history(run_id, "val_mae")
    assert [m.step for m in val_mae] == [4, 8]  # one per epoch, at its last step
    # One key, one meaning: the epoch's values at its last step, the steps' under *_step.
    for name, steps in (("lr", [4, 8]), ("train_loss", [4, 8])):
        assert [m.step for m in client.get_metric_history(run_id, name)] == steps, name
    for name in ("lr_step", "train_loss_step"):
        assert [m.step for m in client.get_metric_history(run_id, name)] == [2, 4, 6, 8], name
    params = client.get_run(run_id).data.params
    assert params["global_batch_size"] == "4"
    assert (params["mesh_shape"], params["spatial_split"]) == ("1x1", "1x1x1")
    assert params["lion_cub_levels_in_use"] == "7"
    # How the step was fed: each epoch's shares beside its samples/s, and where batches were cut.
    assert params["data_placement"] == "device"
    for name in ("samples_per_s", "data_wait_share", "device_busy_share"):
        history = client.get_metric_history(run_id, name)
        assert [m.step for m in history] == [4, 8], name
        assert name == "samples_per_s" or all(0 <= m.value <= 1 for m in history), name
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"metrics.jsonl", "train_summary.json"} <= names


# --- launcher environment -------------------------------------------------------------------


def test_detects_torchrun_slurm_and_single() -> None:
    env = detect_launch_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "1234",
        }
    )
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        "torchrun",
        3,
        8,
        1,
        4,
    )
    assert (env.master_addr, env.master_port) == ("n1", 1234)
    env = detect_launch_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_TASKS_PER_NODE": "4(x2)",
            "SLURM_JOB_ID": "123456",
            "SLURM_JOB_NODELIST": "gpu[017-018]",
            "SLURM_CPUS_PER_TASK": "6",
        }
    )
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        "slurm",
        5,
        8,
        1,
        4,
    )
    assert env.master_addr == "gpu017" and env.master_port == 20000 + 123456 % 20000
    assert env.cpus_per_rank == 6
    env = detect_launch_env(
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7"}
    )
    assert env.master_addr == "10.0.0.7"
    assert detect_launch_env({}).launcher == "single"


def test_first_slurm_host() -> None:
    assert _first_slurm_host("node[03-05,9],gpu1") == "node03"
    assert _first_slurm_host("login2") == "login2"


def test_mesh_sizes_must_multiply_to_world() -> None:
    env = LaunchEnv(
        launcher="torchrun",
        rank=0,
        world_size=6,
        local_rank=0,
        local_world_size=6,
        master_addr="x",
        master_port=1,
    )
    with pytest.raises(ValueError, match=r"data=4 × spatial=2 = 8 does not equal the world size 6"):
        ParallelDims(data=4, spatial=2, env=env, device=torch.device("cpu"), backend="gloo")


# --- two ranks on gloo --------------------------------------------------------------------------

RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    from cosmocub.config import load_config
    from cosmocub.train.main import train
    cfg_path, shards, run, die_at = sys.argv[1:5]
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    seen = {}

    def hook(step, model):
        seen["model"] = model
        if first_attempt and os.environ["RANK"] == "1" and step == int(die_at):
            os._exit(17)  # a rank dies without cleaning up; torchrun restarts every rank

    train(load_config(cfg_path), shards_dir=shards, run_dir=run, on_step_end=hook)
    torch.save(seen["model"].state_dict(), f"{run}/rank{os.environ['RANK']}.pt")
    """
)


@pytest.mark.slow
def test_two_gloo_ranks_survive_a_restart_with_identical_weights(
    shards: Path, tmp_path: Path
) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    values = json.loads(json.dumps(TINY))
    values["train"].update(epochs=2, local_batch_size=2)
    cfg_path.write_text(yaml.safe_dump(values))
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    run = tmp_path / "run"
    run.mkdir()
    # rank 1 dies at step 6 of 8, after the checkpoint at step 5
    args = [str(script), str(cfg_path), str(shards), str(run), "6"]
    proc = multirank.run_ranks(torchrun_argv(2, *args, max_restarts=1), timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = torch.load(run / "rank0.pt", weights_only=True)
    rank1 = torch.load(run / "rank1.pt", weights_only=True)
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    summary = json.loads((run / "train_summary.json").read_text())
    # 16 samples over 2 ranks × batch 2 → 4 steps per epoch, global batch 4.
    assert (summary["world_size"], summary["global_batch_size"], summary["steps"]) == (2, 4, 8)
    assert summary["resumed_from"].endswith("step_00000005.pt")
    ckpt = torch.load(checkpoint_dir(run) / "step_00000008.pt", weights_only=True)
    # Each rank's RNG states are in its data rank's own file, none in rank 0's.
    assert "rng_per_rank" not in ckpt and "rng_per_spatial_rank" in ckpt["per_data_rank"]
    rng = [
        torch.load(checkpoint_dir(run) / f"step_00000008.data_rank_0000{r}.pt", weights_only=True)
        for r in (0, 1)
    ]
    rng = [own["rng_per_spatial_rank"] for own in rng]
    assert [len(r) for r in rng] == [1, 1]
    assert not torch.equal(rng[0][0]["torch"], rng[1][0]["torch"])
    # The model that rank 0 wrote is the weights both ranks hold.
    written = torch.load(run / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(written[k], rank0[k]) for k in rank0)
    # DDP overlapped (the default) is timed: how long its all-reduce ran, and what the steps
    # waited for after backward (all of it here: the tiny model's gradients fill one bucket).
    for epoch in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()):
        assert 0 < epoch["time_exchange_s"] <= epoch["time_exchange_busy_s"], epoch
        assert epoch["time_compute_s"] > 0, epoch


def _kill_first_attempt_rank(launcher: subprocess.Popen, timeout: float = 120) -> int:
    """SIGKILL a rank of the launcher's first attempt as soon as it runs: a crash, no message."""
    import signal
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                env = child.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("COSMOCUB_LAUNCH_ATTEMPT") == "0" and env.get("RANK") == "1":
                os.kill(child.pid, signal.SIGKILL)
                return child.pid
        time.sleep(0.05)
    raise AssertionError("no rank 1 of the first attempt appeared")


@pytest.mark.slow
def test_launch_starts_again_after_a_crash_but_not_after_a_user_error(
    shards: Path, tmp_path: Path
) -> None:
    """A real torchrun under `cosmocub launch`: a killed rank gets a second attempt that trains
    to the end; a user error (a missing shard folder) fails at once, its message once."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("COSMOCUB_USER_ERROR_FILE", "COSMOCUB_LAUNCH_ATTEMPT"):
        env.pop(name, None)
    config = tmp_path / "cfg.yaml"
    train = {**TINY["train"], "epochs": 1, "ranks_per_node": 2}
    config.write_text(yaml.safe_dump({**TINY, "train": train}))
    launch = [sys.executable, "-m", "cosmocub.cli", "launch"]  # 2 ranks: the config's

    missing = tmp_path / "no-shards"
    train_args = ["train", "--config", str(config), "--out", str(tmp_path / "bad")]
    proc = subprocess.run(
        [*launch, "--max-restarts", "2", "--", *train_args, "--shards", str(missing)],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("cosmocub launch: attempt") == 1
    assert "stopped by a user error; not starting the ranks again" in proc.stderr
    # The job log ends with the rank's one-line error, not torchrun's traceback.
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("cosmocub train: error: ") and "stats.json: shard statistics" in last
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
    assert not list(tmp_path.glob(".cosmocub-user-error-*"))  # the marker is cleaned up

    run = tmp_path / "run"
    args = ["train", "--config", str(config), "--shards", str(shards), "--out", str(run)]
    launcher = subprocess.Popen(
        [*launch, "--max-restarts", "1", "--", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        _kill_first_attempt_rank(launcher)
        _, stderr = launcher.communicate(timeout=150)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr[-3000:]
    assert "ranks crashed (exit 1); starting them again" in stderr
    assert "cosmocub launch: attempt 2 of 2" in stderr
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2  # 16 samples, 2 × batch 4
