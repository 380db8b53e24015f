"""Time to train on a GPU cluster = staging (when the timed run holds it) + epochs × (training
epoch + evaluation): the step from the cost model, plus what the implementation runs outside
its kernels (cost_model.software) and the wait for the slowest rank (cost_model.stragglers),
with the loader's wait where it is slower; evaluation as forward-only steps over the validation
split; staging as the node's share of the stored dataset read from the file system and inflated
by the node's cores.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from cosmocub.config import Config, OptimizerConfig
from cosmocub.perfmodel.cost_model.cluster_presets import ClusterPreset
from cosmocub.perfmodel.cost_model.software import SYNC_S, SoftwareProfile
from cosmocub.perfmodel.cost_model.spec_accelerator import SpecAccelerator
from cosmocub.perfmodel.cost_model.stragglers import NO_STRAGGLERS, Stragglers
from cosmocub.perfmodel.cost_model.topology import Mesh
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.run_prediction import Prediction, Workload, predict_run, split_samples

MLPERF_SOURCE = (
    "mlcommons/hpc cosmoflow/README.md: 524288 training and 65536 validation samples of "
    "(128, 128, 128, 4), gzip-compressed TFRecords in a 1.7 TB tarball [V]; int16 counts "
    "(dali_tfr_gzip.py reinterprets each sample as INT16 [128, 128, 128, 4]) [V]"
)


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """The splits' sizes, the bytes of a sample as the loader hands it over, and as stored."""

    train_samples: int
    val_samples: int
    sample_bytes: float
    stored_bytes_per_sample: float
    source: str


MLPERF_COSMOFLOW = Dataset(
    train_samples=524_288,
    val_samples=65_536,
    sample_bytes=4 * 128**3 * 2,
    stored_bytes_per_sample=1.7e12 / (524_288 + 65_536),
    source=MLPERF_SOURCE,
)


def config_dataset(cfg: Config, *, train_samples: int | None = None) -> Dataset:
    """The config's own samples: its model's input (channels × input_size³, 16-bit as shards and
    the MLPerf files hold them) and its splits as preprocessing cuts them (`train_samples`, e.g.
    --train-samples, in place of the train split's). Where the universes cannot be counted here
    (the public CosmoFlow folder lives on the cluster), the MLPerf CosmoFlow splits if the model
    takes their 4 × 128³ samples; else a ValueError asking for the train split's size."""
    sample_bytes = cfg.model.in_channels * cfg.model.input_size**3 * 2
    try:
        train, val = (split_samples(cfg, split) for split in ("train", "val"))
    except ValueError as err:
        if sample_bytes != MLPERF_COSMOFLOW.sample_bytes:
            if train_samples is None:
                raise ValueError(f"{err}: give --train-samples N") from None
            # Without the universes the validation split keeps the MLPerf ratio to training.
            share = MLPERF_COSMOFLOW.val_samples / MLPERF_COSMOFLOW.train_samples
            return Dataset(
                train_samples=train_samples,
                val_samples=round(share * train_samples),
                sample_bytes=sample_bytes,
                stored_bytes_per_sample=sample_bytes,
                source=f"{cfg.source}: --train-samples, uncompressed",
            )
        dataset = MLPERF_COSMOFLOW
    else:
        dataset = Dataset(
            train_samples=train,
            val_samples=val,
            sample_bytes=sample_bytes,
            stored_bytes_per_sample=sample_bytes,
            source=f"{cfg.source}: its splits, uncompressed shards",
        )
    if train_samples is not None:
        dataset = dataclasses.replace(dataset, train_samples=train_samples)
    return dataset


@dataclass(frozen=True, kw_only=True)
class TimeToTrain:
    """The parts of a run's time, each in seconds; `epochs` as given (the model does not
    predict convergence)."""

    step_s: float  # the device's step: compute, exchange, update
    data_wait_s: float  # per step, where the loader is slower than the step
    steps_per_epoch: int
    eval_step_s: float
    eval_steps: int
    eval_reduce_s: float  # the score's all-reduce and its .item() at the end of evaluation
    staging_s: float | None  # None: the file system's rate is not known
    staging_in_run: bool
    epochs: int
    host_s: float = 0.0  # per step: launches and syncs in series with the device, the input's
    # transform on the device (cost_model.software)
    straggler_s: float = 0.0  # per step: the wait for the slowest rank (cost_model.stragglers)
    compute_s: float = 0.0  # of step_s: the layers' forward and backward
    exchange_s: float = 0.0  # of step_s: the exposed exchange and momentum syncs
    # The evaluations after the first, where they read the validation split back from the
    # node's drives (staged_beyond_memory); None: as the first.
    later_eval_step_s: float | None = None

    @property
    def own_s(self) -> float:
        """One rank's own step: all but what it waits on (the exchange, the slowest rank)."""
        return self.step_s - self.exchange_s + self.host_s

    @property
    def full_step_s(self) -> float:
        """The step as a run sees it: the device's, the host's share, the wait for the slowest
        rank and the loader's."""
        return self.step_s + self.host_s + self.straggler_s + self.data_wait_s

    @property
    def train_epoch_s(self) -> float:
        return self.steps_per_epoch * self.full_step_s

    @property
    def eval_s(self) -> float:
        """The first evaluation."""
        return self.eval_steps * self.eval_step_s + self.eval_reduce_s

    @property
    def later_eval_s(self) -> float:
        """Each evaluation after the first."""
        step = self.eval_step_s if self.later_eval_step_s is None else self.later_eval_step_s
        return self.eval_steps * step + self.eval_reduce_s

    @property
    def median_eval_s(self) -> float:
        """The median of the run's evaluations (what a result log's median compares with)."""
        return statistics.median([self.eval_s] + [self.later_eval_s] * (self.epochs - 1))

    @property
    def total_s(self) -> float:
        """Staging (inside the run, where known) + epochs × training epoch + every
        evaluation."""
        staging = self.staging_s if self.staging_in_run and self.staging_s else 0.0
        evaluations = self.eval_s + (self.epochs - 1) * self.later_eval_s
        return staging + self.epochs * self.train_epoch_s + evaluations


def loader_seconds(
    preset: ClusterPreset, dataset: Dataset, batch: int, threads: int | None = None
) -> float:
    """Seconds the loader takes to hand over one step's `batch` samples to a rank: the slower
    of their read, `threads` (default: the preset's loader threads) at the preset's copy rate
    per core, slower by the staging area's read factor (a tmpfs), and their copy to the
    device over its host link (the two overlap: the loader reads ahead while it copies)."""
    threads = preset.loader_threads_per_rank if threads is None else threads
    rate = threads * preset.loader_gbyte_s_per_core * 1e9 / preset.staging_read_factor
    host_link = preset.host_link_gbyte_s * 1e9
    return batch * dataset.sample_bytes * max(1 / rate, 1 / host_link)


def staged_bytes_per_node(dataset: Dataset, nodes: int) -> float:
    """A node's share of both splits as staged (inflated: the submissions' stagers decompress)."""
    return (dataset.train_samples + dataset.val_samples) / nodes * dataset.sample_bytes


def staged_beyond_memory(preset: ClusterPreset, dataset: Dataset, nodes: int) -> bool:
    """Whether a node's staged share exceeds its memory: then each training epoch streams more
    than the page cache holds through it, and evaluations after the first read the validation
    split back from the node's drives (priced where the preset knows their rate)."""
    if preset.host_memory_gbyte is None:
        return False
    return staged_bytes_per_node(dataset, nodes) > preset.host_memory_gbyte * 1e9


def staging_seconds(preset: ClusterPreset, dataset: Dataset, nodes: int) -> float | None:
    """A node's share of the stored dataset read at its share of the file system (at most its
    NICs) and inflated by its cores, the two overlapped (workers read and inflate files in
    turn); None where the preset does not know the file system's rate."""
    if preset.fs_read_gbyte_s is None:
        return None
    samples = (dataset.train_samples + dataset.val_samples) / nodes
    node_read = min(preset.fs_read_gbyte_s / nodes, preset.nics_per_node * preset.nic_gbyte_s)
    read_s = samples * dataset.stored_bytes_per_sample / (node_read * 1e9)
    inflate_rate = preset.cores_per_node * preset.inflate_gbyte_s_per_core * 1e9
    return max(read_s, samples * dataset.sample_bytes / inflate_rate)


def predict_cluster(
    work: Workload,
    preset: ClusterPreset,
    *,
    nodes: int,
    epochs: int,
    dataset: Dataset = MLPERF_COSMOFLOW,
    calibration: GpuLayerTimes | None = None,
    staging_in_run: bool | None = None,
    mesh: Mesh | None = None,
    lion: OptimizerConfig | None = None,
    software: SoftwareProfile | None = None,
    stragglers: Stragglers = NO_STRAGGLERS,
    layer_scale: float = 1.0,
    eval_scale: float = 1.0,
) -> tuple[Prediction, TimeToTrain]:
    """The step on `mesh` (default: data parallel over nodes × the preset's ranks) with NCCL's
    collectives, and the run's time on `preset`; staging_in_run: the preset's unless given (a
    log's own order); lion: Lion's step beside it (run_prediction.predict_run); software: what
    the implementation runs besides its kernels (None: nothing); stragglers: the ranks' spread;
    layer_scale, eval_scale: one measured run's device time and evaluation step ÷ the model's
    (perfmodel.uses.run_calibration; 1: as priced)."""
    ranks = nodes * preset.ranks_per_node
    mesh = mesh or Mesh(data=ranks, split=(1, 1, 1))
    if mesh.world != ranks:
        raise ValueError(
            f"mesh {mesh.data}x{mesh.spatial} is {mesh.world} ranks, not {nodes} nodes x "
            f"{preset.ranks_per_node} ranks of {preset.name}"
        )
    device = SpecAccelerator(spec=preset.spec, calibration=calibration, layer_scale=layer_scale)
    network = preset.network(None if software is None else software.nccl_protocols)
    p = predict_run(work, mesh, network, device, lion=lion, train_samples=dataset.train_samples)
    assert p.steps_per_epoch is not None
    step = p.step
    host_s = 0.0
    if software is not None:
        hbm = preset.spec.rate_bytes
        host_s = software.host_s() + software.input_s(dataset.sample_bytes, hbm, work.local_batch)
    own_s = step.step_s - step.exchange_s - step.momentum_sync_s + host_s
    straggler_s = stragglers.wait_s(own_s, ranks)
    threads = None if software is None else software.reader_threads
    loader_s = loader_seconds(preset, dataset, work.local_batch, threads)
    wait = max(0.0, loader_s - (step.step_s + host_s + straggler_s))
    forward = sum(
        device.forward_seconds(work.model, batch=work.local_batch, split=mesh.split).values()
    )
    if software is None:
        eval_step = max(eval_scale * forward, loader_s)
        eval_syncs = 0
    else:
        transform = software.eval_input_passes * dataset.sample_bytes * work.local_batch
        transform_s = transform / preset.spec.rate_bytes
        eval_step = eval_scale * software.eval_step_s(forward, transform_s, loader_s)
        eval_syncs = software.eval_syncs
    eval_steps = math.ceil(dataset.val_samples / (mesh.data * work.local_batch))
    later_eval_step = None
    if preset.drive_gbyte_s_per_node and staged_beyond_memory(preset, dataset, nodes):
        # Every rank of the node reads its samples from the drives at once; the read overlaps
        # the step as the page cache's does (the loader reads ahead), so the slower paces it.
        node_bytes = preset.ranks_per_node * work.local_batch * dataset.sample_bytes
        later_eval_step = max(eval_step, node_bytes / (preset.drive_gbyte_s_per_node * 1e9))
    ttt = TimeToTrain(
        step_s=step.step_s,
        data_wait_s=wait,
        steps_per_epoch=p.steps_per_epoch,
        eval_step_s=eval_step,
        eval_steps=eval_steps,
        eval_reduce_s=network.collective_s("allreduce", 8.0, ranks) + eval_syncs * SYNC_S,
        staging_s=staging_seconds(preset, dataset, nodes),
        staging_in_run=preset.staging_in_timed_run if staging_in_run is None else staging_in_run,
        epochs=epochs,
        host_s=host_s,
        straggler_s=straggler_s,
        compute_s=step.compute_s,
        exchange_s=step.exchange_s + step.momentum_sync_s,
        later_eval_step_s=later_eval_step,
    )
    return p, ttt
