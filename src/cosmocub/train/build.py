"""Build every piece of a training run from the config and the mesh, resuming if it can.

Separate from `main.train` so benchmarks and tests can drive the same loop without the outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from cosmocub.config import Config, config_hash
from cosmocub.data.augment import symmetries_for_split
from cosmocub.data.dataset import FirstUniverses, read_input_transform
from cosmocub.models.model_factory import build_model
from cosmocub.optim.optimizer_factory import build_optimizer, build_schedule
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.train import runtime
from cosmocub.train.checkpoint import CheckpointManager, resume_values, shard_identity
from cosmocub.train.grad_sync import build_gradient_sync
from cosmocub.train.loaders import build_eval_loader, build_train_loader
from cosmocub.train.loop import Trainer, TrainState
from cosmocub.train.resident_loader import resolve_placement
from cosmocub.train.ridge_start import fit_tap_ridge
from cosmocub.train.step_settings import step_settings
from cosmocub.train.tasks import build_task


def build_trainer(
    cfg: Config,
    dims: ParallelDims,
    *,
    shards_dir: Path,
    run_dir: Path,
    on_step_end: Callable[[int, nn.Module], None] | None = None,
) -> tuple[Trainer, TrainState, Path | None]:
    """(trainer, train state, checkpoint resumed from or None); trainer.log is a no-op to set."""
    tc = cfg.train
    # Workers only read, standardise and turn samples (the sampler draws each sample's symmetry,
    # seeded per step) and batches come in sampler order, so deterministic runs keep them.
    num_workers = tc.num_data_workers
    task = build_task(cfg)
    block = _spatial_block(cfg, dims)
    train_set = task.open_split(shards_dir, "train", block=block)
    if tc.universes is not None:  # the universes study's learning curve
        train_set = FirstUniverses(train_set, tc.universes)
    val_set = task.open_split(shards_dir, "val", block=block)
    if tc.val_universes is not None:  # a fixed subset: each epoch's validation costs less
        val_set = FirstUniverses(val_set, tc.val_universes, key="train.val_universes")
    per_rank = len(train_set) // dims.data
    if per_rank < tc.local_batch_size:
        raise ValueError(
            f"{train_set.path}: {len(train_set)} samples give {per_rank} per data rank "
            f"(x{dims.data}), fewer than train.local_batch_size {tc.local_batch_size}"
        )
    if len(val_set) == 0:
        raise ValueError(f"{val_set.path}: the validation shard holds no samples")
    global_batch = tc.global_batch(dims.data)  # the launched world's data ranks

    runtime.seed_everything(cfg.training_seed)  # same initial weights on every rank
    settings = step_settings(cfg, dims)  # autocast, layout, compile, fused: train.* on this device
    layout = settings.memory_format
    model = _parallelize(build_model(cfg.model).to(dims.device, memory_format=layout), cfg, dims)
    optimizer = build_optimizer(
        model.named_parameters(),
        cfg.optimizer,
        global_batch,
        dims=dims,
        fused=settings.fused_optimizer,
    )
    train_loader = build_train_loader(
        train_set,
        dims,
        batch_size=tc.local_batch_size,
        seed=cfg.training_seed,
        num_workers=num_workers,
        symmetries=symmetries_for_split(cfg.parallel.split_dhw) if tc.augment else None,
        # Whole universes (preprocess.train_crops random): a random crop per sample per epoch.
        random_origins=train_set.random_origins,
        max_batches=tc.max_steps_per_epoch,
        # Where batches are cut (train.data_placement): the same batches whichever.
        placement=resolve_placement(tc.data_placement, train_set, dims),
        memory_format=layout,
    )
    schedule = build_schedule(
        optimizer,
        cfg.optimizer,
        global_batch=global_batch,
        steps_per_epoch=train_loader.sampler.batches_per_epoch,
    )
    # Per data rank, not per rank: a spatial group runs the replicated dense layers together, so
    # its dropout masks must agree; and spatial rank 0, which draws them, then has the stream of
    # the same data rank in an unsplit run, so a split run drops what the unsplit one drops.
    runtime.seed_everything(runtime.rank_seed(cfg.training_seed, dims.axis_rank("data")))
    state = TrainState()
    # One checkpoint folder per (resume-relevant config, training data): a re-run with the same
    # inputs resumes; a changed config or new shards start afresh beside the old checkpoints
    # (the workflow reruns `train` exactly when those inputs change), and say what changed;
    # train.keep_old_checkpoint_folders of the old folders are kept.
    identity = resume_values(
        cfg,
        data_identity=shard_identity(shards_dir, num_train=len(train_set), num_val=len(val_set)),
    )
    run_hash = config_hash(identity)
    checkpoints = CheckpointManager(
        run_dir / "checkpoints" / run_hash,
        config_hash=run_hash,
        stateful={
            "model": getattr(model, "module", model),  # the plain model's keys
            "optimizer": optimizer,
            "schedule": schedule,
            "train_state": state,
        },
        invariants={"data_parallel_size": dims.data, "spatial_split": list(cfg.parallel.split_dhw)},
        identity=identity,
        dims=dims,
    )
    if cfg.model.name == "cosmoflow" and cfg.model.pooled.counts_spectrum:
        # Before the restore, which loads the same values back (the shards are in the run's
        # identity), and before the ridge's fit, which reads the counts' spectrum.
        mean, std, log1p = read_input_transform(shards_dir)
        plain = getattr(model, "module", model)
        plain.pooled.counts_spectrum.set_input_transform(mean, std, log1p=log1p)
    resumed_from = checkpoints.restore_latest()
    if resumed_from is None and cfg.model.name == "cosmoflow" and cfg.model.pooled.tap_ridge:
        # Fitted once, before the first step; a resumed run has it in its checkpoint.
        fit_tap_ridge(
            getattr(model, "module", model),
            train_set,
            batch_size=tc.local_batch_size,
            device=dims.device,
        )
    checkpoints.prune_other_folders(tc.keep_old_checkpoint_folders)
    grad_sync = build_gradient_sync(optimizer, dims, ddp_timing=cfg.train.ddp_exchange_timing)
    trainer = Trainer(
        cfg=cfg,
        dims=dims,
        task=task,
        model=model,
        # after the restore: DDP broadcasts rank 0's weights
        wrapped=settings.compiled(grad_sync.wrap(model)),
        optimizer=optimizer,
        schedule=schedule,
        grad_sync=grad_sync,
        train_loader=train_loader,
        val_loader=build_eval_loader(
            val_set, dims, batch_size=tc.local_batch_size, num_workers=num_workers
        ),
        checkpoints=checkpoints,
        autocast_dtype=settings.autocast_dtype,
        global_batch=global_batch,
        log=lambda metrics, step: None,
        on_step_end=on_step_end,
    )
    return trainer, state, resumed_from


def _spatial_block(cfg: Config, dims: ParallelDims) -> tuple[slice, slice, slice] | None:
    """This rank's block of every sample (None: the whole sample); the config checked at load
    that the split fits every layer of the model (config.check_model_split)."""
    if dims.spatial == 1:
        return None
    from cosmocub.models.parallelize import spatial_block

    split, size = cfg.parallel.split_dhw, cfg.model.input_size
    return spatial_block(dims, split, (size, size, size))


def _parallelize(model: nn.Module, cfg: Config, dims: ParallelDims) -> nn.Module:
    """The model's parallel form (same parameters and state_dict keys): spatial layers under a
    split, and batch norm over the global batch whenever there is more than one rank, so that
    every data × spatial decomposition of a run computes the same thing. On one rank, and
    without batch norm at spatial = 1, it is the model itself."""
    from cosmocub.models.model_factory import parallelize

    pc = cfg.parallel
    return parallelize(model, dims, split=pc.split_dhw, periodic=pc.periodic)
