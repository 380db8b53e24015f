"""Accelerators from their public specifications, each number with its source
beside it ([V]: seen in the cited page; [R]: recalled, the excerpt not retrieved: verify before
leaning on it; [C]: computed from what the cited code builds). No number here is fitted to a
training run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

A100_DATASHEET = (
    "NVIDIA A100 datasheet nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, as tabulated at "
    "glennklockwood.com/garden/processors/A100 [V]"
)
H100_DATASHEET = (
    "NVIDIA H100 datasheet (dense = half the sparse figures) as reproduced at "
    "archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html; dense values at "
    "glennklockwood.com/garden/processors/h100 [V]"
)
H200_SOURCE = (
    "AnandTech SC23 m.anandtech.com/Show/Index/21136 (141 GB, 4.8 TB/s, H100's compute) and "
    "MLPerf inference v4.1 NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json (18 NVLink4, 900 GB/s) [V]"
)
GH200_SOURCE = (
    "nvidia.com/en-us/data-center/grace-hopper-superchip [R: not retrieved; its H100's peaks "
    "taken as the H100 SXM's]"
)
MI250X_SOURCE = (
    "AMD MI250X table at zexron.com/amd-mi250-x-aldebaran-as-mcm-with-up-to-479-teraflop-s-and-"
    "560-watt-tdp (package: 47.9 FP32 vector, 95.7 FP32 matrix, 383 FP16, 3.2 TB/s, 128 GB); a "
    "GCD is half; docs.olcf.ornl.gov/systems/frontier_user_guide.html (GCD-GCD 50-200 GB/s) [V]"
)
LONGHORN_LINKS = "MLPerf HPC v1.0 TACC/systems/longhorn-tf.json: 75 GB/s a way, 3 links [V]"
V100_SOURCE = "NVIDIA V100 datasheet (SXM2: 125 TFLOP/s tensor, 15.7 FP32, 900 GB/s) [R]"
# Achievable shares of peak, one source each, the same for every accelerator of a family.
HBM_SHARE_SOURCE = (
    "A100 80GB: 1.80 of 2.04 TB/s (88 %) measured, ~90 % cited from a GTC talk, "
    "forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083 [V]; "
    "NVIDIA/cccl PRs 9481, 9881 babelstream BWUtil 87-94 % on large arrays [V]"
)
FLOPS_SHARE_SOURCE = (
    "H100 SXM bf16 GEMM 780 of 989 TFLOP/s (79 %), gist.github.com/Chillee/"
    "2ec89696db8b7ed1c24461159e325405 [V]; taken for every GPU's GEMMs and vector work (no "
    "A100/MI250X figure retrieved); 3D convolutions take conv3d_share"
)
# 3D convolutions at one sample a GPU reach far less than a GEMM: a share per family, from
# NVIDIA's MLPerf Training unet3d submissions (a 3D U-Net on 128^3 patches, fp16, NDHWC, MXNet +
# cuDNN, batch 1 a GPU; another benchmark than MLPerf HPC CosmoFlow, whose logs set nothing here).
# The share is the whole training step's (samples/s x conv FLOPs a sample over the dense fp16
# peak), so the U-Net's norms, activations, concats, loss, update and any exposed all-reduce are
# charged to its convolutions: it errs toward a slower conv, the conservative side. A share of the
# convolutions alone would need a model of that other work, which is not measured, so none is used.
UNET3D_FLOPS = (
    "2.86 TFLOP a sample = 2 x MACs of every conv and transposed conv, forward + dgrad + wgrad "
    "(torch FlopCounterMode over forward and backward of the network rebuilt from its "
    "model/unet3d.py, model/layers.py: filters 32-320, 128^3 x 1 channel; 3 x forward = 2.864) [C]"
)
CONV3D_SHARE_AMPERE_SOURCE = (
    "MLPerf Training v2.0 unet3d, DGX A100 80GB, 9 nodes, batch 1 a GPU "
    "(config_DGXA100_9x8x1.sh: 56 GPUs train, 2 nodes evaluate): "
    "mlcommons/training_results_v2.0@8437fbb78349aa3c3054aeccb1d47d2a315a80e7:"
    "NVIDIA/results/dgxa100_n9_ngc22.04_mxnet/unet3d/result_*.txt, tracked_stats throughput, "
    "median over 40 runs 1826.6 samples/s = 32.6 a GPU [V]; x " + UNET3D_FLOPS + " = 93 TFLOP/s, "
    "0.299 of 312 (fp16, cuDNN 8.4); the whole step's share"
)
CONV3D_SHARE_HOPPER_SOURCE = (
    "MLPerf Training v3.0 unet3d, DGX H100, 9 nodes, batch 1 a GPU "
    "(config_DGXH100_9x8x1.sh: 56 GPUs train, 2 nodes evaluate): "
    "mlcommons/training_results_v3.0@63e326c400f5d8bb8c6070a9ab08332d4931152e:"
    "NVIDIA/results/dgxh100_n9_ngc23.04_mxnet/unet3d/result_*.txt, tracked_stats throughput, "
    "median over 40 runs 3492.7 samples/s = 62.4 a GPU [V]; x " + UNET3D_FLOPS + " = 178 TFLOP/s, "
    "0.180 of 989.4 (fp16, cuDNN 8.9); the whole step's share; measured on H100 SXM, taken for "
    "H200 and GH200 (the same H100 compute)"
)
CONV3D_SHARE_UNSOURCED = (
    "no MLPerf unet3d batch-1 figure for this accelerator: conv3d priced as a GEMM, at "
    "flops_share (" + FLOPS_SHARE_SOURCE + "), which is optimistic for 3D convolutions"
)
KERNEL_FLOOR_SOURCE = (
    "developer.nvidia.com/blog/cuda-graphs (a ~2.9 us kernel at ~3.8 us back to back) [R]; "
    "dogacel.github.io/.../four-counter-intuitive-lessons-from-deep-diving-gpu-kernel-dispatch-"
    "overhead (2-4 us a dispatch) [V]"
)
# A kernel's floor: the time a launched kernel takes at the least (launch, ramp, drain).
KERNEL_FLOOR_US = 3.0
HBM_SHARE = 0.88
FLOPS_SHARE = 0.79
CONV3D_SHARE_AMPERE = 0.299  # A100 80GB, unet3d v2.0: 32.6 samples/s x 2.86 TFLOP / 312 TFLOP/s
CONV3D_SHARE_HOPPER = 0.180  # H100 SXM, unet3d v3.0: 62.4 samples/s x 2.86 TFLOP / 989.4 TFLOP/s


@dataclass(frozen=True, kw_only=True)
class AcceleratorSpec:
    """One rank's device: dense peak TFLOP/s per dtype, memory, HBM bandwidth, the links to the
    other devices of its node (datasheet GB/s per direction; NVLinks counted for NCCL), the
    shares of peak a kernel reaches, and where each number comes from."""

    name: str
    arch: str  # NCCL's generation row (volta, ampere, hopper); CDNA2 as ampere (RCCL stand-in)
    peak_tflops: Mapping[str, float]
    memory_gb: float
    hbm_gbyte_s: float
    intra_node_gbyte_s: float
    nvlinks: int
    sources: Mapping[str, str]
    conv3d_share: float  # its source in sources["conv3d_share"]; FLOPS_SHARE where none is known
    hbm_share: float = HBM_SHARE
    flops_share: float = FLOPS_SHARE
    kernel_floor_us: float = KERNEL_FLOOR_US
    # True where intra_node_gbyte_s is a rate a config entry states (perf_model.extrapolate.
    # accelerators' intra_node_gbit): NCCL's collectives then take it as stated, not NVLinks ×
    # NCCL's own per-link figure (cluster_presets.ClusterPreset.nccl_node).
    intra_rate_stated: bool = False

    def _peak_flops(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise ValueError(
                f"accelerator {self.name}: no peak for {dtype!r} (has {sorted(self.peak_tflops)})"
            )
        return self.peak_tflops[dtype] * 1e12

    def rate_flops(self, dtype: str) -> float:
        """The achievable FLOP/s of `dtype` in a GEMM or vector kernel (peak × flops_share)."""
        return self._peak_flops(dtype) * self.flops_share

    def rate_conv3d(self, dtype: str) -> float:
        """The achievable FLOP/s of `dtype` in a 3D convolution, forward or either gradient
        (peak × conv3d_share; the share was measured in fp16 and is taken for every dtype)."""
        return self._peak_flops(dtype) * self.conv3d_share

    @property
    def conv3d_share_measured(self) -> bool:
        """Whether conv3d_share was measured (a GEMM's share stands in where it was not)."""
        return self.sources["conv3d_share"] != CONV3D_SHARE_UNSOURCED

    @property
    def rate_bytes(self) -> float:
        """The achievable HBM bytes/s (peak × hbm_share)."""
        return self.hbm_gbyte_s * 1e9 * self.hbm_share


def _sources(peak: str, hbm: str, links: str, conv3d: str) -> dict[str, str]:
    return {
        "peak_tflops": peak,
        "hbm_gbyte_s": hbm,
        "intra_node_gbyte_s": links,
        "hbm_share": HBM_SHARE_SOURCE,
        "flops_share": FLOPS_SHARE_SOURCE,
        "conv3d_share": conv3d,
        "kernel_floor_us": KERNEL_FLOOR_SOURCE,
    }


A100_PEAKS = {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}
H100_PEAKS = {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}


def _nvidia(name: str, memory_gb: float, hbm: float, hbm_source: str) -> AcceleratorSpec:
    """An A100 (NVLink3: 12 links, 300 GB/s a way) or a Hopper (NVLink4: 18, 450) by name."""
    hopper = "A100" not in name
    datasheet = H100_DATASHEET if hopper else A100_DATASHEET
    links = "NVLink4 900 GB/s both ways, 18 links" if hopper else "NVLink3 600 GB/s, 12 links"
    return AcceleratorSpec(
        name=name,
        arch="hopper" if hopper else "ampere",
        peak_tflops=H100_PEAKS if hopper else A100_PEAKS,
        memory_gb=memory_gb,
        hbm_gbyte_s=hbm,
        intra_node_gbyte_s=450.0 if hopper else 300.0,
        nvlinks=18 if hopper else 12,
        sources=_sources(
            datasheet,
            hbm_source,
            f"{datasheet} ({links})",
            CONV3D_SHARE_HOPPER_SOURCE if hopper else CONV3D_SHARE_AMPERE_SOURCE,
        ),
        conv3d_share=CONV3D_SHARE_HOPPER if hopper else CONV3D_SHARE_AMPERE,
    )


ACCELERATORS: dict[str, AcceleratorSpec] = {
    "a100_40gb": _nvidia("A100 SXM4 40GB", 40, 1555.0, A100_DATASHEET),
    "a100_80gb": _nvidia("A100 SXM4 80GB", 80, 2039.0, A100_DATASHEET),
    "h100_sxm": _nvidia("H100 SXM5 80GB", 80, 3350.0, H100_DATASHEET),
    "h200": _nvidia("H200 SXM 141GB", 141, 4800.0, H200_SOURCE),
    "gh200": _nvidia("GH200 (H100, 96 GB HBM3)", 96, 4000.0, GH200_SOURCE),
    "mi250x_gcd": AcceleratorSpec(
        name="MI250X, one GCD",
        arch="ampere",
        peak_tflops={"fp32": 23.95, "fp32_matrix": 47.9, "fp16": 191.5, "bf16": 191.5},
        memory_gb=64,
        hbm_gbyte_s=1600.0,
        intra_node_gbyte_s=100.0,
        nvlinks=0,
        sources={
            **_sources(
                MI250X_SOURCE,
                MI250X_SOURCE,
                MI250X_SOURCE + " (other packages: 50-100)",
                CONV3D_SHARE_UNSOURCED,
            ),
            "hbm_share": HBM_SHARE_SOURCE + " [R: NVIDIA's figures taken for AMD]",
        },
        conv3d_share=FLOPS_SHARE,  # no 3D-conv figure found for CDNA2
    ),
    "v100_sxm2": AcceleratorSpec(
        name="V100 SXM2 16GB",
        arch="volta",
        peak_tflops={"fp32": 15.7, "fp16": 125.0},
        memory_gb=16,
        hbm_gbyte_s=900.0,
        intra_node_gbyte_s=75.0,
        nvlinks=3,
        sources=_sources(V100_SOURCE, V100_SOURCE, LONGHORN_LINKS, CONV3D_SHARE_UNSOURCED),
        # No MLPerf unet3d batch-1 run on V100. NVIDIA/DeepLearningExamples' PyTorch nnU-Net
        # README has one (AMP, ~0.26 of 125), but from another stack (0.76x unet3d's on A100).
        conv3d_share=FLOPS_SHARE,
    ),
}
