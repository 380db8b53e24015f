"""examples/lion_cub_any_script.py, as README.md's "Lion Cub in your own script" runs it: two
gloo ranks under torchrun, with its checkpoint kept to read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lion_cub_any_script.py"


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
    saved = torch.load(checkpoint, weights_only=True)["optimizer"]
    assert saved["data_group_size"] == 2 and saved["step_count"] == 20
    momenta = saved["state"][0]["exp_avg_per_data_rank"]
    assert momenta.shape == (2, 64, 32)
    assert not torch.equal(momenta[0], momenta[1])  # each rank's own, 5 steps after a sync
