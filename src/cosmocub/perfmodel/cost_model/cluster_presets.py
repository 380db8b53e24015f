"""GPU clusters from public descriptions (the MLPerf HPC system files, the centres' pages),
each number with its source beside it ([V] seen, [R] recalled, as hardware_specs); presets for
`perf-model predict --cluster` and for the MLPerf comparison (benchmarks/against_mlperf.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cosmocub.perfmodel.cost_model.cluster_network import NcclNetwork
from cosmocub.perfmodel.cost_model.hardware_specs import ACCELERATORS, AcceleratorSpec
from cosmocub.perfmodel.cost_model.nccl_collectives import NVLINK_GBYTE_S, NcclNode

MLPERF_V3 = "mlcommons/hpc_results_v3.0 @ dfea490b1e7b6545eb5c8b7a4ff9b05021cba098"
MLPERF_V2 = "mlcommons/hpc_results_v2.0 @ ad77f6ceae98bf1236a4a0bb79257c2b739197b9"
MLPERF_V1 = "mlcommons/hpc_results_v1.0 @ 2ba081f43a28d8e19dc572da72b2f14862599c1f"
# Per core, for the data path (no measurement of these machines' cores was retrieved):
INFLATE_SOURCE = "zlib inflate, ~0.4 GB/s of output a core on current x86 [R]"
COPY_SOURCE = "a core's copy out of the page cache, ~5 GB/s [R]"
DALI_THREADS = (
    f"dali_threads: 4 in the NVIDIA/HPE+LBNL PyTorch implementation's configs, {MLPERF_V3} "
    "HPE+LBNL/benchmarks/cosmoflow/implementations/cosmoflow-pytorch/configs [V]"
)
# tmpfs (/dev/shm) against a disk file system's page cache, one core copying a 16.8 MB sample
# out of a mapped file: benchmarks/bench_staging_read.py on the 2-core machine (kernel 6.18,
# load 1.0-2.5) seven runs 2.47-2.84x, and a first probe (load 0.6) 2.07x and 2.5x: median 2.5x.
# Measured here, not on the clusters' kernels.
TMPFS_READ_FACTOR = 2.5
TMPFS_SOURCE = (
    "tmpfs reads a mapped sample 2.5x slower than a page cache (2.47-2.84x in seven runs of "
    "benchmarks/bench_staging_read.py, 2.07x and 2.5x in a first probe like it, on the 2-core "
    "machine, kernel 6.18) [V: measured here]"
)
PCIE4 = "PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b, 31.5 GB/s a direction (PCI-SIG) [R]"
DATA_PATH = {
    "loader_threads_per_rank": DALI_THREADS,
    "loader_gbyte_s_per_core": COPY_SOURCE,
    "inflate_gbyte_s_per_core": INFLATE_SOURCE,
    "host_link_gbyte_s": PCIE4,
}


@dataclass(frozen=True, kw_only=True)
class ClusterPreset:
    """A GPU system: its nodes (accelerator, ranks, CPU vendor, NICs and their rate), what NCCL
    runs on it (LL128 on or off, by the GPU-NIC path), its file system and data path, whether
    a run's staging falls inside the timed run, and where each number comes from."""

    name: str
    system: str
    accelerator: str
    ranks_per_node: int
    cores_per_node: int
    cpu_vendor: str
    nics_per_node: int
    nic_gbit_s: float
    ll128: bool = False
    fs_read_gbyte_s: float | None = None  # the file system's aggregate read rate, if known
    staging_in_timed_run: bool = True
    loader_threads_per_rank: int = 4
    loader_gbyte_s_per_core: float = 5.0
    inflate_gbyte_s_per_core: float = 0.4
    staging_read_factor: float = 1.0  # a staged sample's read ÷ a page cache's (tmpfs: more)
    host_link_gbyte_s: float = 31.5  # a GPU's link to its host, one direction (PCIe 4.0 x16)
    host_memory_gbyte: float | None = None  # the node's memory: what the page cache can hold
    # The node's local drives' read rate: where its staged share outgrows its memory, the
    # evaluations after the first read the validation split back from them (time_to_train).
    drive_gbyte_s_per_node: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    accelerator_spec: AcceleratorSpec | None = None  # in place of ACCELERATORS[accelerator]

    @property
    def spec(self) -> AcceleratorSpec:
        return self.accelerator_spec or ACCELERATORS[self.accelerator]

    @property
    def nic_gbyte_s(self) -> float:
        """NCCL's NIC rate: Gbit/s ÷ 8 (topo.cc: speed in Mb/s ÷ 8000)."""
        return self.nic_gbit_s / 8

    def nccl_node(self) -> NcclNode:
        """The node as NCCL's search sees it: NVLinks at topo.h's per-link rate (xGMI and other
        links at the datasheet's; a rate a config entry states, as stated), the NICs at their
        rate, LL128 as the preset says."""
        spec = self.spec
        by_links = spec.nvlinks and not spec.intra_rate_stated
        intra = spec.nvlinks * NVLINK_GBYTE_S if by_links else spec.intra_node_gbyte_s
        return NcclNode(
            arch=spec.arch,
            cpu_vendor=self.cpu_vendor,
            intra_link="nvlink",
            intra_gbyte_s=intra,
            nics=self.nics_per_node,
            nic_gbyte_s=self.nic_gbyte_s,
            ranks_per_node=self.ranks_per_node,
            ll128=self.ll128,
        )

    def network(self, protocols: tuple[str, ...] | None = None) -> NcclNetwork:
        """NCCL on these nodes; `protocols`: NCCL_PROTO where a run script sets it."""
        node = self.nccl_node()
        if protocols is not None:
            node = dataclasses.replace(node, protocols=protocols)
        return NcclNetwork(node=node)


DGX = "{round} NVIDIA/systems/{json}: 8 GPUs, compute 8x ConnectX-{nic} [V]"
PXB = "NICs on the GPUs' PCIe switches (PXB): tuning.cc enables LL128 [R: topology not read]"
STAGED_IN = "staging after run_start in the v1.0-v3.0 logs of this system [V]"
# Eos's weak-scaling instances (v3.0, 4 nodes of 8 H100) read every sample from the node's
# drives: their 4-node configs set use_direct_io (O_DIRECT, no page cache; dali_tfr_gzip.py's
# default true), and their evaluations are flat: 5.76 s median (59 logs, first and later alike,
# 5.66-5.95) for 65,536 samples at batch 1 on 32 GPUs, 2,048 steps of 2.81 ms, 8 samples of
# 16.8 MB a node a step: 47.7 GB/s a node. The DGX A100 (v2.0) has the same drives (the systems
# files' "30 TB U.2 NVMe"; eight 3.84 TB PCIe 4.0 drives in both datasheets [R]). Read from the
# logs, not a specification: the drives' datasheet rate, ~7 GB/s each [R], would be 56 GB/s.
EOS_DRIVES_GBYTE_S = 8 * 4 * 128**3 * 2 * 2048 / 5.76 / 1e9
EOS_DRIVES_SOURCE = (
    f"{MLPERF_V3} NVIDIA eos_n256 weak results (4-node instances): evaluations flat at 5.76 s, "
    "2,048 steps reading 8 x 16.8 MB a node O_DIRECT (use_direct_io, dali_tfr_gzip.py) from the "
    "node's '30 TB U.2 NVMe' (systems files; the same drives in a DGX A100 and a DGX H100) "
    "[V: read from the logs]"
)
EOS = ClusterPreset(
    name="eos",
    system="NVIDIA Eos (DGX H100)",
    accelerator="h100_sxm",
    ranks_per_node=8,
    cores_per_node=112,
    cpu_vendor="intel",
    nics_per_node=8,
    nic_gbit_s=400,
    ll128=True,
    staging_in_timed_run=False,
    host_memory_gbyte=2000.0,
    host_link_gbyte_s=63.0,
    drive_gbyte_s_per_node=EOS_DRIVES_GBYTE_S,
    sources={
        "node": DGX.format(
            round=MLPERF_V3,
            json="eos_n64_ngc23.09_pytorch.json",
            nic="7 IB NDR 400 Gb/s; 2x Xeon 8480C, 56 cores each",
        ),
        "ll128": PXB,
        "staging_in_timed_run": "staging_start..stop before run_start in every v3.0 Eos log; "
        "mlcommons/logging issue 318 (staging out of the HPC v3.0 score) [V]",
        "host_memory_gbyte": f"{MLPERF_V3} NVIDIA/systems/eos_n64_ngc23.09_pytorch.json: "
        "host_memory_capacity 2.0 TB [V]",
        "drive_gbyte_s_per_node": EOS_DRIVES_SOURCE,
        "host_link_gbyte_s": "H100 SXM5 on PCIe 5.0 x16: 32 GT/s x 16 lanes, 63 GB/s a "
        "direction [R]",
        **DATA_PATH,
    },
)
PERLMUTTER = ClusterPreset(
    name="perlmutter",
    system="NERSC Perlmutter GPU (A100 40GB), 2023",
    accelerator="a100_40gb",
    ranks_per_node=4,
    cores_per_node=64,
    cpu_vendor="amd",
    nics_per_node=4,
    nic_gbit_s=200,
    fs_read_gbyte_s=5000.0,
    staging_read_factor=TMPFS_READ_FACTOR,
    host_memory_gbyte=256.0,
    sources={
        "node": f"{MLPERF_V3} HPE+LBNL/systems/perlmutter_128x4.json (1x EPYC 7763, "
        "4x A100-SXM4-40GB, Slingshot); docs.nersc.gov/systems/perlmutter/architecture "
        "(4 NICs a GPU node) [V]; Slingshot-11 200 Gb/s a NIC [R]",
        "ll128": "NICs behind the CPU (PHB: the implementation sets NCCL_NET_GDR_LEVEL=PHB, "
        f"{MLPERF_V3} HPE+LBNL/.../configs/config_pm_common.sh [V]): LL128 off",
        "fs_read_gbyte_s": "NERSC: Perlmutter scratch (all-flash Lustre) ~5 TB/s [R]",
        "staging_read_factor": f"STAGING_DIR=/dev/shm: {MLPERF_V3} HPE+LBNL/benchmarks/"
        "cosmoflow/implementations/cosmoflow-pytorch/configs/config_pm_common.sh [V]; "
        + TMPFS_SOURCE,
        "host_memory_gbyte": "perlmutter_128x4.json: host_memory_capacity 256 GB DDR4 [V]",
        "staging_in_timed_run": STAGED_IN,
        **DATA_PATH,
    },
)
HOREKA = ClusterPreset(
    name="horeka",
    system="KIT HoreKa GPU (A100 40GB)",
    accelerator="a100_40gb",
    ranks_per_node=4,
    cores_per_node=76,
    cpu_vendor="intel",
    nics_per_node=2,
    nic_gbit_s=200,
    host_memory_gbyte=512.0,
    sources={
        "node": f"{MLPERF_V2} HelmholtzAI/systems/horeka_gpu_n512_pytorch1.13.json: 2x Xeon "
        "8368 (76 cores), 4 GPUs 'A100-PCIE-40GB' over NVLink, host_networking '4xHDR ( "
        "Mellanox 200 Gbit InfiniBand ConnectX 6)' [V]; taken as A100 SXM4 40GB (HoreKa's "
        "are SXM4 [R]; HelmholtzAI's JUWELS Booster file says PCIE too)",
        "nics_per_node": "nhr.kit.edu/userdocs/horeka/hardware: 'Each node has two Intel Xeon "
        "processors, ... and two high-performance network adapters. All nodes are connected "
        "by an extremely fast, low-latency InfiniBand 4X HDR interconnect' [V]: '4xHDR' in the "
        "systems file is the link's width (4 lanes of HDR: the 200 Gbit it names), not four "
        "adapters (JUWELS Booster's file says '4x Mellanox HDR200 ...': four); two IB HDR "
        "adapters of 200 Gb/s taken (that both carry the IB fabric is a reading) [V/R]",
        "ll128": "GPU-NIC path not known: LL128 off [R]",
        "host_memory_gbyte": "horeka_gpu_n512_pytorch1.13.json: host_memory_capacity 512 GB "
        "[V]; staged to ${TMP} (configs/2022configs/horeka_512gpus_bs1.sh) [V], a folder on "
        "the node's NVMe [R], read through its page cache",
        "staging_in_timed_run": STAGED_IN,
        **DATA_PATH,
    },
)
CLUSTERS: dict[str, ClusterPreset] = {
    p.name: p
    for p in (
        EOS,
        PERLMUTTER,
        dataclasses.replace(
            PERLMUTTER,
            name="perlmutter_2021",
            system="NERSC Perlmutter GPU, phase 1 (2021: 2 NICs a node)",
            nics_per_node=2,
            nic_gbit_s=100,
            staging_read_factor=1.0,
            sources={
                **PERLMUTTER.sources,
                "staging_read_factor": "v1.0 LBNL's config_pm_common.sh is not in the published "
                "tree: the staging area is not known, a page cache taken [R]",
                "node": f"{MLPERF_V1} LBNL/systems/perlmutter_256x4_ngc21.09_mxnet.json [V]; "
                "archived NERSC page portal.nersc.gov/cfs/nstaff/siddiq90/nersc.gitlab.io/"
                "public/systems/perlmutter/interconnect ('Each node is connected to 2 NICs') "
                "[V]; Slingshot-10, 100 Gb/s a NIC [R]",
            },
        ),
        ClusterPreset(
            name="frontier",
            system="OLCF Frontier (MI250X, a GCD a rank)",
            accelerator="mi250x_gcd",
            ranks_per_node=8,
            cores_per_node=64,
            cpu_vendor="amd",
            nics_per_node=4,
            nic_gbit_s=200,
            fs_read_gbyte_s=10000.0,
            sources={
                "node": "docs.olcf.ornl.gov/systems/frontier_user_guide.html: 1x 64-core EPYC, "
                "4x MI250X = 8 GCDs [V]; 4x Slingshot 200 Gb/s [R]",
                "ll128": "RCCL priced with NCCL's model, xGMI as NVLink, LL128 off [R]",
                "fs_read_gbyte_s": "Orion (Lustre) ~10 TB/s [R]",
                "staging_in_timed_run": "as the non-NVIDIA MLPerf runs [R]",
                **DATA_PATH,
            },
        ),
        dataclasses.replace(
            EOS,
            name="selene",
            system="NVIDIA Selene (DGX A100 80GB)",
            accelerator="a100_80gb",
            cores_per_node=128,
            cpu_vendor="amd",
            nic_gbit_s=200,
            staging_in_timed_run=True,
            host_link_gbyte_s=31.5,
            sources={
                **EOS.sources,
                "host_link_gbyte_s": PCIE4,
                "node": DGX.format(
                    round=MLPERF_V2, json="dgxa100_n64_pytorch.json", nic="6 IB HDR 200 Gb/s"
                )
                + "; 2x EPYC 7742; NVIDIA's HPC submissions ran on Selene [R]",
                "staging_in_timed_run": STAGED_IN,
                "host_memory_gbyte": f"{MLPERF_V2} NVIDIA/systems/dgxa100_n64_pytorch.json: "
                "host_memory_capacity 2 TB [V]",
            },
        ),
        HOREKA,
        dataclasses.replace(
            HOREKA,
            name="juwels_booster",
            system="JSC JUWELS Booster (A100 40GB)",
            cores_per_node=48,
            cpu_vendor="amd",
            nics_per_node=4,
            sources={
                **HOREKA.sources,
                "node": f"{MLPERF_V1} HelmholtzAI/systems/juwelsbooster_gpu_n512_mxnet1.9.json: "
                "2x EPYC 7402 (48 cores), 4 GPUs 'A100-PCIE-40GB', 4x HDR200 [V]; taken as A100 "
                "SXM4 40GB with NVLink3 (JUWELS Booster's are [R])",
                "host_memory_gbyte": "512 GB a JUWELS Booster node [R]",
                "nics_per_node": "juwelsbooster_gpu_n512_mxnet1.9.json: host_networking '4x "
                "Mellanox HDR200 InfiniBand ConnectX 6' [V]",
            },
        ),
        dataclasses.replace(
            HOREKA,
            name="longhorn",
            system="TACC Longhorn (V100, POWER9)",
            accelerator="v100_sxm2",
            cores_per_node=40,
            cpu_vendor="other",
            nics_per_node=1,
            nic_gbit_s=100,
            host_memory_gbyte=None,
            sources={
                **HOREKA.sources,
                "node": f"{MLPERF_V1} TACC/systems/longhorn-tf.json: 2x POWER9 (40 cores), 4x "
                "V100 SXM2 16GB, IB EDR [V]; one EDR NIC of 100 Gb/s [R]",
                "ll128": "NCCL 2.4.8 (the system file): no LL128 [R]",
            },
        ),
        dataclasses.replace(
            HOREKA,
            name="cori_gpu",
            system="NERSC Cori GPU (8 V100 a node)",
            accelerator="v100_sxm2",
            ranks_per_node=8,
            cores_per_node=40,
            nics_per_node=4,
            nic_gbit_s=100,
            host_memory_gbyte=384.0,
            sources={
                **HOREKA.sources,
                "node": "mlcommons/hpc_results_v0.7 LBNL/systems/corigpu_n64_tf1.15.0.json: 2x "
                "Xeon Gold 6148 (40 cores), 8 V100 over NVLink (hybrid cube-mesh), '4 dual-port "
                "Mellanox MT27800 (ConnectX-5) EDR InfiniBand network cards' (4 NICs of 100 Gb/s "
                "taken: one port each), 384 GB [V]",
                "ll128": "NCCL 2.4.8 (the systems file): no LL128 [R]",
                "host_memory_gbyte": "corigpu_n64_tf1.15.0.json: host_memory_capacity 384 GB [V]",
            },
        ),
    )
}


def cluster(name: str) -> ClusterPreset:
    """The preset `name`, or a ValueError listing the known ones."""
    if name not in CLUSTERS:
        raise ValueError(f"--cluster {name}: not one of {', '.join(CLUSTERS)}")
    return CLUSTERS[name]


# Perlmutter's NICs went from 2 (Slingshot-10) to 4 (Slingshot-11) a node in 2022 [R].
PERLMUTTER_UPGRADE = datetime(2022, 1, 1, tzinfo=UTC)


def preset_for_system(system: str, accelerator: str, run_start_ms: float) -> str | None:
    """The preset a published system is, by its name and accelerator (the MLPerf systems
    file's accelerator_model_name or the log's submission_platform) and, for Perlmutter, the
    date of the run; None where no preset has that system or accelerator."""
    name, gpu = system.lower(), accelerator.upper()
    if "H100" in gpu:
        return "eos"
    if "dgxa100" in name or "A100-SXM4-80GB" in gpu:
        return "selene"
    if "perlmutter" in name:
        when = datetime.fromtimestamp(run_start_ms / 1e3, tz=UTC)
        return "perlmutter" if when >= PERLMUTTER_UPGRADE else "perlmutter_2021"
    if "horeka" in name:
        return "horeka"
    if "juwels" in name:
        return "juwels_booster"
    if "corigpu" in name:
        return "cori_gpu"
    if "longhorn" in name or "V100" in gpu:
        return "longhorn"
    return None


def described_cluster(
    spec: AcceleratorSpec, *, ranks_per_node: int, node_gbit_s: float
) -> ClusterPreset:
    """A machine described by flags: `ranks_per_node` GPUs of `spec` a node, each with a NIC of
    its own (rails, as DGX nodes and Perlmutter's) sharing the node's `node_gbit_s`; LL128 on
    where the GPUs have NVLinks (NCCL enables it for NVLink nodes whose NICs sit on the GPUs'
    PCIe switches, the DGX layout), an Intel host (NCCL's net overhead), the file system's rate
    unknown (staging not priced)."""
    return ClusterPreset(
        name="by_flags",
        system=f"{ranks_per_node} x {spec.name} a node, {node_gbit_s:g} Gbit/s a node (flags)",
        accelerator=spec.name,
        accelerator_spec=spec,
        ranks_per_node=ranks_per_node,
        cores_per_node=16 * ranks_per_node,
        cpu_vendor="intel",
        nics_per_node=ranks_per_node,
        nic_gbit_s=node_gbit_s / ranks_per_node,
        ll128=spec.nvlinks > 0,
        sources={"node": "perf-model predict's flags; one NIC a GPU assumed (rails)"},
    )
