"""examples/lion_cub_any_script.py, as README.md and docs/lion-cub.md run it: two gloo ranks
under torchrun, with its checkpoint kept to read back; its --backend flag."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lion_cub_any_script.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lion_cub_any_script", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_backend_flag_is_parsed_and_nccl_without_cuda_stops_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _example()
    assert example.parse_args([]).backend == "gloo"
    assert example.parse_args(["--backend", "nccl"]).backend == "nccl"
    with pytest.raises(SystemExit):
        example.parse_args(["--backend", "mpi"])
    assert "invalid choice: 'mpi'" in capsys.readouterr().err
    assert example.device_for("gloo") == torch.device("cpu")
    # No GPU (a CPU build, or none on this node): before any process group, in one line.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit) as stop:
        example.main(["--backend", "nccl"])
    message = str(stop.value.code)
    assert message.startswith("--backend nccl needs one CUDA GPU a rank: LOCAL_RANK 0, torch ")
    assert "sees 0 GPUs (use --backend gloo" in message and "\n" not in message
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "2")  # a third rank on a node of two GPUs
    with pytest.raises(SystemExit, match="LOCAL_RANK 2, torch sees 2 GPUs"):
        example.device_for("nccl")


@pytest.mark.slow
def test_example_trains_on_two_ranks_and_resumes_bit_identical(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt.pt"
    argv = torchrun_argv(2, str(EXAMPLE), "--checkpoint", str(checkpoint))
    proc = multirank.run_ranks(argv, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "resumed from the checkpoint: bit-identical" in out, out
    first, last = map(float, re.search(r"loss (\S+) -> (\S+) over 40 steps", out).groups())
    assert last < 0.2 * first, out
    sent, fp32 = map(float, re.search(r"rank 0: (\d+) \(an fp32 .*: (\d+)\)", out).groups())
    # One bucket of n = 2,177 values padded to 16: the all-to-all sends half the 4-bit codes,
    # the all-gather one rank's 1-bit votes; two fp32 momentum syncs (steps 15, 30) in 40 steps.
    n, padded = 2177, 2192
    assert fp32 == 4 * n
    assert abs(sent - (padded * 4 / 8 / 2 + padded / 2 / 8 + 2 * 4 * n / 40)) < 1, out
    assert set(torch.load(checkpoint, weights_only=True)) == {
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    }
    saved = [torch.load(f"{checkpoint}.rank{r}", weights_only=True) for r in range(2)]
    for rank, state in enumerate(saved):  # each rank's own momentum, in a file of its own
        assert (state["data_group_size"], state["data_rank"], state["step_count"]) == (2, rank, 20)
        assert state["state"][0]["exp_avg"].shape == (64, 32)
    # Each rank's own, 5 steps after a sync.
    assert not torch.equal(saved[0]["state"][0]["exp_avg"], saved[1]["state"][0]["exp_avg"])
