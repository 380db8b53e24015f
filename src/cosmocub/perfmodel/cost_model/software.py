"""What an implementation runs a training step besides the kernels the roofline prices: kernel
launches outside a CUDA graph, host syncs, graph launches, the input's transform on the device,
how it evaluates, and which NCCL protocols it allows. One profile per implementation priced,
each count with its source (the code read), each cost with a public measurement.

A host sync makes the host wait for the device; the launches issued after it are in series
with the device (it idles while the host issues kernels shorter than a launch: a step's
optimizer loop over 16 tensors). Launches issued while a graph runs are hidden under it; the
profiles count only those after the step's last sync. Where a step has no sync, the host runs
ahead and its launches are hidden unless they outnumber what the device takes longer to run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

V3 = "mlcommons/hpc_results_v3.0 NVIDIA/benchmarks/cosmoflow/implementations/pytorch"
V2 = "mlcommons/hpc_results_v2.0 NVIDIA/benchmarks/cosmoflow/implementations/pytorch"
HPE = "mlcommons/hpc_results_v3.0 HPE+LBNL/benchmarks/cosmoflow/implementations/cosmoflow-pytorch"
V1 = "mlcommons/hpc_results_v1.0 NVIDIA/benchmarks/cosmoflow/implementations/mxnet"

# Costs of the host's side, each from a public measurement (no GPU here to time them).
LAUNCH_S = 8e-6
LAUNCH_SOURCE = (
    "a PyTorch eager op submitted back to back on an A100 host: 8 us an op (flagos-ai/Torch-FL "
    "PR 27, add[512^2] 'cuda_sub'); the driver's own cuLaunchKernel is 3.0 us of it "
    "(meta-pytorch/tritonbench PR 1017) [V: read, not measured here]"
)
SYNC_S = 9e-6
SYNC_SOURCE = (
    "the same op with a sync after each: 17 us against 8 (Torch-FL PR 27, A100), so ~9 us a "
    "round trip beyond the work it waits for; 4.7-7.1 us spin and blocking in CUDA.jl PR 896 [V]"
)
GRAPH_LAUNCH_S = 8e-6
GRAPH_LAUNCH_SOURCE = (
    "a CUDA graph's launch costs the host about one kernel launch: JuliaGPU's graphs page, an "
    "80-kernel graph launched with 3.5 us of CPU time, an MLP's with 8 us [V]"
)
COSTS = {"launch_s": LAUNCH_SOURCE, "sync_s": SYNC_SOURCE, "graph_launch_s": GRAPH_LAUNCH_SOURCE}


@dataclass(frozen=True, kw_only=True)
class SoftwareProfile:
    """One implementation's step outside its kernels, per step and rank:
    serial_launches   eager kernel launches the device waits for (after the step's last sync)
    host_syncs        the host waits on the device (GradScaler's .item(), a metric's asnumpy)
    graph_launches    CUDA graphs replayed
    input_passes      bytes of HBM traffic per input byte as loaded (int16 counts): the
                      transform to fp32 and the copy into the graph's input (0 where the loader
                      hands over the graph's input itself)
    step_graph        forward, backward and the all-reduce in one graph (else eager: every
                      layer's launches are the host's too, hidden where the device is slower)
    eval_mode, eval_batch, eval_launches  evaluation's forward: eager or a graph, its batch,
                      and its launches a step (eager: in series where the device is faster)
    eval_input_passes bytes of HBM traffic per input byte an evaluation step (the transform
                      only: eager evaluation has no static input to copy into)
    eval_syncs        host syncs an evaluation (the score's .item() after its all-reduce)
    reader_threads    the threads a rank's samples pass through one at a time on their way
                      out of the staging area (None: the preset's loader threads)
    nccl_protocols    NCCL_PROTO, where the run script sets it (None: NCCL's own choice)
    spread            the runs' spread of the training epoch, (10th, 90th percentile) ÷ median,
                      where the profile stands for published runs"""

    name: str
    description: str
    serial_launches: int
    host_syncs: int
    graph_launches: int
    input_passes: float
    step_graph: bool
    eval_mode: str
    eval_batch: int
    eval_launches: int
    eval_input_passes: float = 0.0
    eval_syncs: int = 0
    reader_threads: int | None = None
    nccl_protocols: tuple[str, ...] | None = None
    spread: tuple[float, float] | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    def host_s(self) -> float:
        """Seconds a step spends on the host in series with the device."""
        return (
            self.serial_launches * LAUNCH_S
            + self.host_syncs * SYNC_S
            + self.graph_launches * GRAPH_LAUNCH_S
        )

    def input_s(self, sample_bytes: float, hbm_bytes_per_s: float, batch: int) -> float:
        """Seconds of the input's transform and copy on the device, a step of `batch` samples."""
        return self.input_passes * sample_bytes * batch / hbm_bytes_per_s

    def eval_step_s(self, forward_s: float, transform_s: float, read_s: float) -> float:
        """One evaluation step: the slowest of the device (the forward after the input's
        transform), the host (an eager step's launches; a graph's one) and the loader (`read_s`:
        its samples' read out of the staging area or their copy to the device, the slower).
        Nothing syncs a step, so the three overlap and the slowest paces the steps."""
        device = forward_s + transform_s
        host = GRAPH_LAUNCH_S if self.eval_mode == "graph" else self.eval_launches * LAUNCH_S
        return max(device, host, read_s)


# int16 in (2 bytes a value) -> fp32 out (4) by log1p: 1 + 2 bytes per input byte; the copy of
# the fp32 result into the graph's static input: 2 + 2 more.
LOG1P_AND_COPY = 7.0
PYTORCH_STEP = (
    "trainer.py: after GradScaler's .item() each step the host issues the fixed_sgd loop "
    "(optimizer.py, @torch.jit.script, per tensor buf.mul().add() and param.sub_(): 3 launches x "
    "16 tensors, + 1 for each of 2 tensors with weight decay in the 64x8 configs), the scale "
    "update (1), the next step's log1p (1) and two input copies (2): {n} launches; 2 graph "
    "replays (zero_capture, graph_capture); one .item() (GradScaler._maybe_opt_step) [V: read]"
)
PYTORCH_EVAL = (
    "trainer.py eval_epoch, model/cosmoflow.py, utils/utils.py: eager, torch.no_grad, a fresh "
    "autocast context a step (its cast cache dies with it): log1p 1; 5 conv blocks x (fp16 "
    "casts of weight and bias 2, cuDNN conv 1, its bias add 1 (aten _convolution adds it "
    "apart), leaky_relu 1, max_pool3d 1) + the first input's cast 1 = 31; permute+flatten a "
    "view; 3 dense x (casts 2, addmm 1) + 2 leaky_relu = 11; tanh 1, x 1.2 1; y.float() 1; "
    "L1Loss(sum) sub, abs, sum 3 and the running += 1: 50 launches [V: read; counted, not "
    "profiled]"
)
PYTORCH_INPUT = (
    "trainer.py _convert_format: input_tensor.log1p() of the int16 DALI output to fp32, then "
    "static_input_data.copy_() [V: read]"
)
# Evaluation: log1p only (int16 read 1 byte, fp32 written 2, per input byte); no graph input.
LOG1P = 3.0
PYTORCH_EVAL_IO = (
    "trainer.py eval_epoch: per step _convert_format (log1p) and the eager forward, the score "
    "accumulated on the device (no sync a step); utils.py DistributedMeanAbsoluteError."
    "get_value: torch.tensor([error, items]) of the device's error (a sync), one all_reduce "
    "and one .item(): two syncs an evaluation [V: read]. The samples: data/dali_core.py, one DALI "
    "pipeline a rank (batch dali_threads=4, sliced to 1 a step); its TFRecord reader maps the "
    "staged files (dont_use_mmap = use_direct_io: False in the 64x8 configs and all of v2.0) "
    "and a DALI reader prefetches through one thread (NVIDIA/DALI dali/operators/reader/"
    "reader_op.h, DataReader::PrefetchWorker, ReadOne a sample in turn) [V: read]. That one "
    "copy a sample at one core's rate paces evaluation is inferred: 2.2-2.5 ms a step "
    "published on DGX A100 and HoreKa, 16.8 MB at 7-8 GB/s, the rate of one core's copy out "
    "of the page cache (benchmarks/bench_staging_read.py: 7.4-11.2 GB/s on this machine) [inferred]"
)


def _pytorch_sources(code: str, step: str, nccl: str) -> dict[str, str]:
    """The sources of a PyTorch submission's profile: `code` names its files, `step` what its
    step runs, `nccl` its NCCL setting; its input, evaluation and costs as NVIDIA's v3.0."""
    return {
        "step": f"{code} {step}",
        "input_passes": f"{code} " + PYTORCH_INPUT,
        "eval": f"{code} " + PYTORCH_EVAL,
        "eval_io": f"{code} " + PYTORCH_EVAL_IO,
        "nccl_protocols": f"{code} run_and_time.sh: {nccl}",
        **COSTS,
    }


NVIDIA_V3 = SoftwareProfile(
    name="nvidia_v3",
    description="NVIDIA MLPerf HPC v3.0 PyTorch (NGC 23.09, CUDA graph, fixed_sgd, DALI)",
    serial_launches=54,
    host_syncs=1,
    graph_launches=2,
    input_passes=LOG1P_AND_COPY,
    step_graph=True,
    eval_mode="eager",
    eval_batch=1,
    eval_launches=50,
    eval_input_passes=LOG1P,
    eval_syncs=2,
    reader_threads=1,
    sources=_pytorch_sources(
        V3, PYTORCH_STEP.format(n="50 + 1 + 1 + 2 = 54"), "NCCL_DEBUG only [V]"
    ),
)
# v2.0's trainer and optimizer are v3.0's but for profiling markers; HPE+LBNL ran NVIDIA's v3.0
# files with NCCL_PROTO=simple: the same counts, their own sources.
NVIDIA_V2 = dataclasses.replace(
    NVIDIA_V3,
    name="nvidia_v2",
    description="NVIDIA MLPerf HPC v2.0 PyTorch (NGC 22.08, CUDA graph, fixed_sgd, DALI)",
    sources=_pytorch_sources(
        V2,
        "trainer.py, optimizer.py: as v3.0's but profiling markers [V: diffed]; "
        + PYTORCH_STEP.format(n="54"),
        "NCCL_DEBUG only [V]",
    ),
)
HPE_LBNL_V3 = dataclasses.replace(
    NVIDIA_V3,
    name="hpe_lbnl_v3",
    description="HPE+LBNL MLPerf HPC v3.0 PyTorch on Perlmutter (NVIDIA's code, NCCL_PROTO=simple)",
    nccl_protocols=("Simple",),
    sources=_pytorch_sources(
        HPE,
        "trainer.py, optimizer.py: NVIDIA's v3.0 files but the copyright line [V: diffed]",
        "NCCL_PROTO=simple [V]",
    ),
)
MXNET_V1 = SoftwareProfile(
    name="mxnet_v1",
    description="MLPerf HPC v1.0 MXNet (NGC 21.09: CUDA graphs, Horovod, aggregated SGD)",
    serial_launches=2,
    host_syncs=2,
    graph_launches=2,
    input_passes=0.0,
    step_graph=True,
    eval_mode="eager",
    eval_batch=1,
    eval_launches=35,
    sources={
        "step": f"{V1} train.py: MXNET_ENABLE_CUDA_GRAPHS=1 (forward, backward), Horovod's "
        "all-reduce outside them, SGD aggregated over all 16 tensors "
        "(MXNET_OPTIMIZER_AGGREGATION_SIZE=54: 1-2 launches); mx.metric.MAE's update calls "
        ".asnumpy() on label and prediction each step (2 syncs) [V: read; NGC 21.09's MXNet "
        "build not checked]",
        "input_passes": f"{V1}: the loader hands over the network's input [V: read]",
        "eval": f"{V1} train.py: model(data) eager, batch 1 [V: read]",
        **COSTS,
    },
)
COSMOCUB_EAGER = SoftwareProfile(
    name="cosmocub_eager",
    description="cosmocub's own step, eager (train.compile false): DDP, foreach optimizer",
    serial_launches=0,
    host_syncs=0,
    graph_launches=0,
    input_passes=0.0,
    step_graph=False,
    eval_mode="eager",
    eval_batch=1,
    eval_launches=35,
    sources={
        "step": "src/cosmocub/train/loop.py: no host sync a step (the losses come to the host "
        "every train.log_every_steps steps, one sync there: _check_losses); every launch "
        "eager, issued ahead of the device (hidden where the device's kernels are longer); the "
        "batch's copy to the device is not priced [V: read]",
        "input_passes": "src/cosmocub/data/dataset.py: shards hold log1p'd fp32 samples [V]",
        **COSTS,
    },
)
PROFILES: dict[str, SoftwareProfile] = {
    p.name: p for p in (NVIDIA_V3, NVIDIA_V2, HPE_LBNL_V3, MXNET_V1, COSMOCUB_EAGER)
}


def profile(name: str) -> SoftwareProfile:
    if name not in PROFILES:
        raise ValueError(f"software profile {name!r}: not one of {', '.join(PROFILES)}")
    return PROFILES[name]


def software_for(framework: str, submitter: str) -> SoftwareProfile | None:
    """The profile of a published run by its systems file's framework and submitter; None
    where none is known (the row says so)."""
    if "MXNET" in framework.upper():
        return MXNET_V1
    if "PYTORCH" not in framework.upper():
        return None
    if "23.09" in framework:
        return HPE_LBNL_V3 if "LBNL" in submitter.upper() else NVIDIA_V3
    return NVIDIA_V2  # 22.08, and HelmholtzAI's PyTorch 1.13 (NVIDIA's v2.0 code, assumed)
