"""evaluation.linear_probes: the model's own errors on every split, and ridges on its pooled taps
that find a parameter where the data put it and nowhere else."""

from __future__ import annotations

import json

import h5py
import numpy as np
import torch

from cosmocub.config import load_config
from cosmocub.evaluation.linear_probes import probe_maes, split_outputs, tap_widths
from cosmocub.models.model_factory import build_model

SIDE = 8


def _write(path, rng, n):
    # Channel 0's amplitude follows y0; nothing else carries a parameter.
    y = rng.uniform(-1, 1, size=(n, 4)).astype(np.float32)
    x = rng.normal(size=(n, 4, SIDE, SIDE, SIDE))
    x[:, 0] *= 1 + 0.5 * y[:, 0, None, None, None]
    with h5py.File(path, "w") as f:
        f["x"] = x.astype(np.float32)
        f["y"] = y
        f["universe_index"] = np.arange(n, dtype=np.int32)
        f.attrs["log1p"] = True


def test_a_ridge_on_the_input_tap_finds_what_the_model_was_not_trained_to(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in {"train": 60, "val": 8, "test": 30}.items():
        _write(tmp_path / f"{split}.h5", rng, n)
    stats = {"mean": [0.0] * 4, "std": [1.0] * 4, "split": "train"}
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    model_section = {"input_size": SIDE, "num_conv_blocks": 1, "base_filters": 2}
    model_section |= {"dense_sizes": [8], "pooled": {"stats": "moments", "order": 4}}
    model_section["pooled"] |= {"spectrum_bins": 3, "taps": ["input", "blocks"]}
    sizes = {"universes": {"size": 16}, "preprocess": {"sample_size": SIDE}}
    cfg = load_config(None, {"model": model_section, **sizes}).model
    torch.manual_seed(0)
    model = build_model(cfg).eval()  # untrained: its own errors are the prior's, ~0.5
    assert tap_widths(cfg) == {"input": 4 * (4 + 3), "block0": 4 * 2}
    maes = probe_maes(model, tmp_path)
    pred, true, _ = split_outputs(model, tmp_path, "test", model.pooled)
    with torch.inference_mode(), h5py.File(tmp_path / "test.h5") as f:
        direct = model(torch.from_numpy(f["x"][:])).numpy()[:, :4]
    np.testing.assert_allclose(maes["model test"], np.abs(direct - true).mean(0), rtol=1e-5)
    np.testing.assert_allclose(pred, direct, rtol=1e-5)
    # The input tap holds channel 0's amplitude: y0 read far better than the mean's ~0.5, and
    # the other parameters, which nothing holds, not.
    assert maes["tap input"][0] < 0.2 and maes["all taps"][0] < 0.25
    assert np.all(maes["tap input"][1:] > 0.35)
    assert maes["model test"][0] > 0.3
    assert set(maes) >= {"model train", "model val", "last layer input", "tap block0"}
