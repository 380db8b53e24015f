"""The model against GPU clusters: presets from public specifications, compute from the
roofline of each kernel (or from layer times measured on a GPU), time to train from its parts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from cosmocub.cli import main
from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.cluster_presets import CLUSTERS, cluster
from cosmocub.perfmodel.cost_model.hardware_specs import ACCELERATORS
from cosmocub.perfmodel.cost_model.roofline import Kernel, kernel_seconds, step_kernels
from cosmocub.perfmodel.cost_model.spec_accelerator import SpecAccelerator
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes, require_cuda, time_layers
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import (
    MLPERF_COSMOFLOW,
    config_dataset,
    predict_cluster,
)

MLPERF = Path(__file__).parents[1] / "config" / "cosmoflow-mlperf.yaml"
SOURCED = (
    "peak_tflops",
    "hbm_gbyte_s",
    "intra_node_gbyte_s",
    "hbm_share",
    "flops_share",
    "conv3d_share",
)


def mlperf_work() -> Workload:
    cfg = load_config(MLPERF)
    return dataclasses.replace(Workload.of(cfg), local_batch=1, epochs=23)


def test_a_cluster_preset_loads_with_its_node_and_every_number_sourced() -> None:
    eos = cluster("eos")
    node = eos.nccl_node()
    assert (eos.ranks_per_node, eos.spec.name, node.arch) == (8, "H100 SXM5 80GB", "hopper")
    assert (node.nics, node.nic_gbyte_s, node.intra_gbyte_s) == (8, 50.0, 360.0)
    assert not eos.staging_in_timed_run and cluster("perlmutter").staging_in_timed_run
    assert cluster("perlmutter").spec.hbm_gbyte_s == 1555.0
    for spec in ACCELERATORS.values():
        assert all(spec.sources.get(key) for key in SOURCED), spec.name
    for preset in CLUSTERS.values():
        assert preset.sources.get("node") and preset.accelerator in ACCELERATORS
    with pytest.raises(ValueError, match="--cluster nowhere: not one of eos, perlmutter"):
        cluster("nowhere")


def test_a_kernel_takes_the_slower_of_its_flops_and_bytes_plus_the_floor() -> None:
    memory = Kernel("relu", flops=1e6, nbytes=2e9)
    math_bound = Kernel("linear", flops=1e15, nbytes=1e3, matrix=True)
    conv = Kernel("conv", flops=1e15, nbytes=1e3, matrix=True, conv3d=True)
    rates = {
        "conv3d_flops": 2.5e14,
        "matrix_flops": 1e15,
        "vector_flops": 1e13,
        "hbm": 1e12,
        "floor_s": 3e-6,
    }
    assert kernel_seconds(memory, **rates) == pytest.approx(2e-3 + 3e-6)
    assert kernel_seconds(math_bound, **rates) == pytest.approx(1.0 + 3e-6)
    assert kernel_seconds(conv, **rates) == pytest.approx(4.0 + 3e-6)
    slow_bytes = Kernel("conv", flops=1e15, nbytes=1e13, matrix=True, conv3d=True)
    assert kernel_seconds(slow_bytes, **rates) == pytest.approx(10.0 + 3e-6)


def test_3d_convolutions_take_the_unet3d_share_and_dense_layers_the_gemm_share() -> None:
    model = load_config(MLPERF).model
    layers = step_kernels(model, batch=1, spatial=1, act=2)
    block1 = {k.name: k for k in layers["block1"]}
    convs = [block1[n] for n in ("conv", "conv wgrad", "conv dgrad")]
    assert all(k.conv3d and k.matrix for k in convs)
    gemms = [k for k in layers["head"] if k.matrix]
    assert gemms and not any(k.conv3d for k in gemms)
    floor = 3e-6
    # Compute-bound (32 -> 64 channels at 64³: 29 GFLOP, 50 MB): the H100's conv3d share of its
    # 989.4 TFLOP/s, 0.180 (MLPerf Training unet3d v3.0), not the GEMM share 0.79
    h100 = SpecAccelerator(spec=ACCELERATORS["h100_sxm"])
    conv = block1["conv"]
    assert conv.flops / (989.4e12 * 0.180) > 2 * conv.nbytes / (3350e9 * 0.88)
    assert h100.seconds([conv]) == pytest.approx(conv.flops / (989.4e12 * 0.180) + floor)
    a100 = SpecAccelerator(spec=ACCELERATORS["a100_40gb"])
    assert a100.seconds([conv]) == pytest.approx(conv.flops / (312e12 * 0.299) + floor)
    # A compute-bound GEMM keeps 0.79 of peak on either
    gemm = Kernel("linear", flops=1e13, nbytes=1e3, matrix=True)
    assert h100.seconds([gemm]) == pytest.approx(1e13 / (989.4e12 * 0.79) + floor)
    assert a100.seconds([gemm]) == pytest.approx(1e13 / (312e12 * 0.79) + floor)
    # No 3D-conv figure for V100 or MI250X: their convs are priced as GEMMs, and say so
    for key in ("v100_sxm2", "mi250x_gcd"):
        spec = ACCELERATORS[key]
        assert spec.conv3d_share == spec.flops_share
        assert spec.sources["conv3d_share"].startswith("no MLPerf unet3d batch-1 figure")
    assert "training_results_v3.0@" in ACCELERATORS["h100_sxm"].sources["conv3d_share"]
    assert "training_results_v2.0@" in ACCELERATORS["a100_80gb"].sources["conv3d_share"]


def test_conv_block_bytes_count_activations_fwd_and_bwd_and_the_step_is_memory_bound() -> None:
    model = load_config(MLPERF).model
    layers = step_kernels(model, batch=1, spatial=1, act=2)
    block0 = {k.name: k for k in layers["block0"]}
    y = 32 * 128**3  # the first conv's output values
    assert block0["leaky relu"].nbytes == 2 * 2 * y  # read and write, fp16
    assert block0["conv"].flops == 2 * 27 * 4 * 32 * 128**3
    assert "conv dgrad" not in block0  # the input needs no gradient
    assert "conv dgrad" in {k.name for k in layers["block1"]}
    # At one sample a GPU the convolutions run at unet3d's shares (H100 ÷ A100: 1.91x) and the
    # rest is bandwidth-bound (HBM: 2.15x): the step's ratio is near those, not the peaks' (3.2x)
    h100, a100 = (SpecAccelerator(spec=ACCELERATORS[k]) for k in ("h100_sxm", "a100_40gb"))
    step = {
        d.name: sum(d.layer_seconds(model, batch=1, split=(1, 1, 1)).values()) for d in (h100, a100)
    }
    ratio = step[a100.name] / step[h100.name]
    assert 1.8 < ratio < 2.3
    # Spatial split: the blocks' work is shared, the head's is not
    split = h100.layer_seconds(model, batch=1, split=(2, 1, 1))
    whole = h100.layer_seconds(model, batch=1, split=(1, 1, 1))
    assert split["block0"] < 0.6 * whole["block0"] and split["head"] == whole["head"]


def test_time_to_train_is_staging_plus_epochs_of_training_and_evaluation() -> None:
    work = mlperf_work()
    p, ttt = predict_cluster(work, cluster("perlmutter"), nodes=128, epochs=23)
    assert ttt.steps_per_epoch == 524_288 // 512 == p.steps_per_epoch
    assert ttt.eval_steps == 65_536 // 512
    assert ttt.step_s == p.step.step_s
    assert ttt.staging_in_run and ttt.staging_s is not None and ttt.staging_s > 0
    train = ttt.steps_per_epoch * (ttt.step_s + ttt.data_wait_s)
    evaluation = ttt.eval_steps * ttt.eval_step_s + ttt.eval_reduce_s
    assert ttt.train_epoch_s == pytest.approx(train)
    assert ttt.eval_s == pytest.approx(evaluation)
    assert ttt.total_s == pytest.approx(ttt.staging_s + 23 * (train + evaluation))
    # Staged before the timed run (Eos's order), staging is not in the time to train
    _, eos = predict_cluster(
        work, cluster("perlmutter"), nodes=128, epochs=23, staging_in_run=False
    )
    assert eos.total_s == pytest.approx(23 * (train + evaluation))
    # A loader slower than the step is waited for
    slow = dataclasses.replace(cluster("perlmutter"), loader_gbyte_s_per_core=0.1)
    _, waited = predict_cluster(work, slow, nodes=128, epochs=23)
    # ... its four threads' copy slowed by the staging area (Perlmutter's /dev/shm)
    loader = MLPERF_COSMOFLOW.sample_bytes * slow.staging_read_factor / (4 * 0.1e9)
    assert slow.staging_read_factor == 2.5
    assert waited.data_wait_s == pytest.approx(loader - waited.step_s)


def test_the_ring_crosses_a_node_once_so_seven_eighths_of_ddp_bytes_stay_on_nvlink() -> None:
    p, _ = predict_cluster(mlperf_work(), cluster("eos"), nodes=64, epochs=1)
    inter, intra = p.inter_node_bytes_per_step, p.intra_node_bytes_per_step
    assert inter / (inter + intra) == pytest.approx(1 / 8)


def test_gpu_layer_calibration_round_trips_and_replaces_the_roofline(tmp_path: Path) -> None:
    model = dataclasses.replace(load_config(MLPERF).model, input_size=32, num_conv_blocks=3)
    calls: list[int] = []

    def fake_timer(fn, repeats: int) -> float:  # a CPU stand-in for the CUDA-event timer
        fn()
        calls.append(repeats)
        return 1e-3 * len(calls)

    train, forward = time_layers(
        model,
        batch=1,
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        timer=fake_timer,
        repeats=2,
    )
    assert list(train) == ["block0", "block1", "block2", "head"] == list(forward)
    times = GpuLayerTimes(
        device="test", batch=1, dtype="fp16", train_s=train, forward_s=forward, torch_version="x"
    )
    times.write(tmp_path / "gpu.json")
    back = GpuLayerTimes.read(tmp_path / "gpu.json")
    assert back == times
    device = SpecAccelerator(spec=ACCELERATORS["h100_sxm"], calibration=back)
    assert device.layer_seconds(model, batch=1, split=(1, 1, 1)) == train
    with pytest.raises(ValueError, match="timed at batch 1, unsplit; asked for batch 2"):
        device.layer_seconds(model, batch=2, split=(1, 1, 1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_calibrating_on_cuda_without_a_gpu_fails_saying_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"torch\.cuda\.is_available\(\) is False"):
        require_cuda()
    rc = main(
        [
            "perf-model",
            "calibrate",
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "g.json"),
            "--config",
            str(MLPERF),
        ]
    )
    assert rc == 2 and "is False on this machine" in capsys.readouterr().err
    assert not (tmp_path / "g.json").exists()


def test_predict_on_a_cluster_is_one_flag(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["perf-model", "predict", "--config", str(MLPERF), "--cluster", "eos", "--nodes", "64"]
    once = "{train: {local_batch_size: 1}}"
    assert main([*flags, "--override", once, "--epochs", "23"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA Eos (DGX H100): 64 nodes x 8 = 512 ranks" in out
    assert "training epoch" in out and "time to train:" in out
    assert main([*flags, "--accelerator", "h100"]) == 2
    assert "--accelerator: not with --cluster eos" in capsys.readouterr().err
    assert main([*flags, "--ranks-per-node", "4"]) == 2
    assert "--cluster eos has 8 a node" in capsys.readouterr().err


def test_a_cluster_prediction_prices_the_configs_own_samples() -> None:
    # The default config: 32³ crops of 4 channels, 8 of each 64³ universe; its 48 universes
    # split 34 / 7 / 7 (0.7 / 0.15 / 0.15).
    own = config_dataset(load_config(None))
    assert own.sample_bytes == 4 * 32**3 * 2 and (own.train_samples, own.val_samples) == (272, 56)
    assert config_dataset(load_config(None), train_samples=1000).train_samples == 1000
    # The MLPerf config's universes live on the cluster: its 4 × 128³ samples take the MLPerf
    # splits; a model of other samples without its universes needs --train-samples.
    assert config_dataset(load_config(MLPERF)) == MLPERF_COSMOFLOW
    other = load_config(
        MLPERF, overrides={"model": {"input_size": 64}, "preprocess": {"sample_size": 64}}
    )
    with pytest.raises(ValueError, match="give --train-samples N"):
        config_dataset(other)
    given = config_dataset(other, train_samples=8192)
    assert (given.train_samples, given.val_samples, given.sample_bytes) == (
        8192,
        1024,
        4 * 64**3 * 2,
    )


def test_lion_cubs_two_level_exchange_is_priced_on_nccls_primitives() -> None:
    cfg = load_config(MLPERF)
    base = mlperf_work()
    inter, exchange = {}, {}
    for hierarchy in ("flat", "node"):
        lion_cub = {"quantizer": "sign", "collective": "alltoall", "hierarchy": hierarchy}
        opt = load_config(
            MLPERF, overrides={"optimizer": {"name": "lion_cub", "lion_cub": lion_cub}}
        ).optimizer
        work = dataclasses.replace(base, optimizer=opt, model=cfg.model)
        p, _ = predict_cluster(work, cluster("eos"), nodes=64, epochs=1)
        inter[hierarchy] = p.inter_node_bytes_per_step
        exchange[hierarchy] = p.step.exchange_s
    # The vote over the 64 nodes' rails on 1/8 of each bucket: fewer bytes leave the node, and
    # far fewer all-to-all rounds than over 512 ranks
    assert inter["node"] < inter["flat"] / 4
    assert 0 < exchange["node"] < exchange["flat"]
