"""model.pooled.tap_ridge: the fixed ridge on the input tap that a CosmoFlow starts from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from shard_fixtures import make_random_shards
from test_train import tiny_cfg
from torch.utils.data import TensorDataset
from torch.utils.flop_counter import FlopCounterMode

from cosmocub.config import ConfigError, load_config
from cosmocub.config.model_split import check_spatial_split
from cosmocub.data.ridge import fit_ridge
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.model_factory import load_model_file
from cosmocub.models.summary import summarize
from cosmocub.train import build
from cosmocub.train.main import train
from cosmocub.train.ridge_start import fit_tap_ridge
from cosmocub.train.tasks import build_task

torch.set_num_threads(1)

POOLED = {"stats": "moments", "order": 4, "norm": "whiten", "spectrum_bins": 3, "tap_ridge": True}


def ridge_cfg(**pooled):
    model = {"input_size": 8, "num_conv_blocks": 2, "base_filters": 4, "dense_sizes": [8]}
    model |= {"head": "gaussian", "pooled": POOLED | pooled}
    return load_config(None, overrides={"preprocess": {"sample_size": 8}, "model": model})


def fields_with_known_parameters(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (n, 4, 8, 8, 8), y (n, 4)): each channel's amplitude and offset drawn, the targets a
    fixed mix of them squashed into [-1, 1), so a ridge on the moments reads them well."""
    g = torch.Generator().manual_seed(seed)
    amplitude = 0.5 + torch.rand(n, 4, generator=g)
    offset = torch.randn(n, 4, generator=g)
    x = torch.randn(n, 4, 8, 8, 8, generator=g) * amplitude[..., None, None, None]
    x = x + offset[..., None, None, None]
    mix = torch.randn(8, 4, generator=torch.Generator().manual_seed(99))
    y = torch.tanh(0.5 * torch.cat([amplitude - 1.0, offset], dim=1) @ mix)
    return x, y


def test_the_model_starts_as_the_baselines_ridge_and_saves_it() -> None:
    cfg = ridge_cfg()
    torch.manual_seed(0)
    model = CosmoFlow(cfg.model)
    assert not model.pooled.ridge.fitted
    x, y = fields_with_known_parameters(64, seed=1)
    rng_before = torch.get_rng_state()
    fit = fit_tap_ridge(model, TensorDataset(x, y), batch_size=16, device=torch.device("cpu"))
    # The fit draws nothing from the global RNG: dropout masks stay those of a run without it.
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert model.pooled.ridge.fitted
    # The moments hold amplitude and offset: far better than predicting the mean.
    spread = (y - y.mean(0)).abs().mean(0).numpy()
    assert np.all(fit["train_mae"] < 0.5 * spread), (fit["train_mae"], spread)

    # The means are the ridge of data/ridge.py (the classical baselines' estimator) fitted on
    # the tap's statistics against atanh(y / output_scale): the network's share starts at zero.
    scale = cfg.model.output_scale
    with torch.no_grad():
        features = model.pooled.input_statistics(x).double().numpy()
        x_new, y_new = fields_with_known_parameters(16, seed=2)
        expected = fit_ridge(features, np.arctanh(y.double().numpy() / scale))
        expected_new = np.tanh(
            expected.predict(model.pooled.input_statistics(x_new).double().numpy())
        )
        model.eval()
        out = model(x_new)
    np.testing.assert_allclose(out[:, :4].numpy(), expected_new * scale, rtol=1e-4, atol=1e-5)
    # The log-variances start at the ridge's residual variance on the training samples.
    with torch.no_grad():
        train_means = model(x)[:, :4].double().numpy()
    variance = (train_means - y.double().numpy()).var(axis=0)
    log_variance = np.broadcast_to(np.log(variance), (len(x_new), 4))
    np.testing.assert_allclose(out[:, 4:].numpy(), log_variance, rtol=1e-4)
    assert np.abs(out[:, :4].numpy() - y_new.numpy()).mean() < 0.5 * spread.mean()

    # Buffers, not parameters: no optimizer moves them, and the model file carries them.
    names = {name for name, _ in model.named_parameters()}
    assert not any(name.startswith("pooled.ridge") for name in names)
    restored = CosmoFlow(cfg.model).eval()
    restored.load_state_dict(model.state_dict())
    assert restored.pooled.ridge.fitted
    with torch.no_grad():
        torch.testing.assert_close(restored(x_new), out)
    # model-summary counts its matmul, as torch's FLOP counter does (norm batch: the summary
    # leaves out the whitening's per-forward matrix, which no sample pays for).
    batch_norm_cfg = ridge_cfg(norm="batch")
    summary = summarize(batch_norm_cfg.model)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        CosmoFlow(batch_norm_cfg.model).eval()(x_new[:1])
    assert summary["flops_per_sample"] == counter.get_total_flops()
    (layer,) = (layer for layer in summary["layers"] if layer["name"] == "pooled.ridge")
    assert layer["flops"] == 2 * 4 * (4 + 3) * 4
    without = summarize(ridge_cfg(norm="batch", tap_ridge=False).model)["pooled_branch"]
    assert summary["pooled_branch"]["flops"] == without["flops"] + layer["flops"]
    with pytest.raises(ValueError, match=r"TapRidge: fit of shape \(4, 3\) \+ \(4,\), expected"):
        model.pooled.ridge.set_fit(torch.zeros(4, 3), torch.zeros(4))


def test_tap_ridge_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"'model\.pooled\.tap_ridge'.*stats 'none'"):
        ridge_cfg(stats="none", norm="batch", spectrum_bins=0)
    with pytest.raises(ConfigError, match=r"'model\.pooled\.tap_ridge'.*taps \['blocks'\]"):
        ridge_cfg(taps=["blocks"], norm="batch", spectrum_bins=0)
    cfg = ridge_cfg(spectrum_bins=0)
    with pytest.raises(ValueError, match=r"tap_ridge: .*split \[1, 2, 1\] divides them"):
        check_spatial_split(cfg.model, 8, [1, 2, 1])
    assert cfg.model.pooled.identity()["tap_ridge"] is True
    assert "tap_ridge" not in ridge_cfg(tap_ridge=False).model.pooled.identity()


def test_training_holds_the_fit_fixed_and_a_resume_does_not_refit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = make_random_shards(tmp_path / "s", counts={"train": 16, "val": 8}, size=8, seed=4)
    cfg = tiny_cfg(model={"head": "gaussian", "pooled": POOLED | {"spectrum_bins": 0}})
    fits = []
    monkeypatch.setattr(build, "fit_tap_ridge", lambda *a, **k: fits.append(fit_tap_ridge(*a, **k)))

    def die_at_step_7(step: int, model: torch.nn.Module) -> None:
        if step == 7:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, shards_dir=shards, run_dir=tmp_path / "run", on_step_end=die_at_step_7)
    assert len(fits) == 1
    summary = train(cfg, shards_dir=shards, run_dir=tmp_path / "run")
    assert summary["resumed_from"].endswith("step_00000005.pt")
    assert len(fits) == 1  # the resumed run has the fit in its checkpoint

    # After 12 steps the ridge is the fit the run started from: a fresh fit on the same shard.
    model = load_model_file(tmp_path / "run/model.pt")
    fresh = CosmoFlow(cfg.model)
    train_set = build_task(cfg).open_split(shards, "train", block=None)
    fit_tap_ridge(fresh, train_set, batch_size=4, device=torch.device("cpu"))
    torch.testing.assert_close(model.pooled.ridge.weight, fresh.pooled.ridge.weight)
    torch.testing.assert_close(model.pooled.ridge.bias, fresh.pooled.ridge.bias)
    # ... and the network beside it did learn: the output layer left zero.
    assert model.head.output.weight.abs().max() > 1e-3


def test_counts_spectrum_is_the_classical_pk_of_the_counts_the_shards_stored(
    tmp_path: Path,
) -> None:
    # model.pooled.counts_spectrum: the input tap also takes the log P(k) of the count
    # overdensity, the counts recovered from the standardised log1p input with the shards'
    # statistics: the classical baselines' `pk` feature (data.features), whatever the
    # standardisation, and it is set from the shards before the first step and saved.
    from cosmocub.data.dataset import read_input_transform
    from cosmocub.data.features import counts_power_spectrum

    shards = make_random_shards(tmp_path / "s", counts={"train": 16, "val": 8}, size=8, seed=5)
    mean, std, log1p = read_input_transform(shards)
    assert log1p and len(mean) == 4 and all(s > 0 for s in std)
    cfg = ridge_cfg(counts_spectrum=True)
    torch.manual_seed(0)
    model = CosmoFlow(cfg.model).eval()
    assert model.pooled.whitened == (4 + 3 + 3) * 4
    model.pooled.counts_spectrum.set_input_transform(mean, std, log1p=log1p)
    g = torch.Generator().manual_seed(6)
    counts = torch.poisson(torch.full((2, 4, 8, 8, 8), 2.0), generator=g)
    counts[1, 3] *= 3.0  # a channel whose overdensity's power is not that of a Poisson field
    x = (torch.log1p(counts) - torch.tensor(mean).view(1, -1, 1, 1, 1)) / torch.tensor(std).view(
        1, -1, 1, 1, 1
    )
    with torch.no_grad():
        tap = model.pooled.input_statistics(x).double()  # moments (4·4), log spectrum, counts'
    assert tap.shape == (2, (4 + 3 + 3) * 4)
    counts_spectrum = tap[:, 4 * 4 + 3 * 4 :].reshape(2, 3, 4)  # (B, bins, C)
    for b in range(2):
        for c in range(4):
            _, expected = counts_power_spectrum(counts[b, c].double().numpy(), num_bins=3)
            np.testing.assert_allclose(
                counts_spectrum[b, :, c].numpy(), np.log(expected), rtol=1e-4, atol=1e-4
            )
    # Not the log-density spectrum: the two differ, or the feature would add nothing.
    assert not torch.allclose(counts_spectrum, tap[:, 16:28].reshape(2, 3, 4), atol=0.05)
    with pytest.raises(ValueError, match=r"CountsSpectrum: the shards standardise 3 channels"):
        model.pooled.counts_spectrum.set_input_transform(mean[:3], std[:3], log1p=True)
    with pytest.raises(ConfigError, match=r"'model\.pooled\.counts_spectrum'.*spectrum_bins is 0"):
        ridge_cfg(counts_spectrum=True, spectrum_bins=0)
    assert ridge_cfg(counts_spectrum=True).model.pooled.identity()["counts_spectrum"] is True
    assert "counts_spectrum" not in ridge_cfg().model.pooled.identity()
    # model-summary counts its binning matmul, as torch's FLOP counter does.
    batch_norm_cfg = ridge_cfg(norm="batch", counts_spectrum=True)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        CosmoFlow(batch_norm_cfg.model).eval()(x[:1])
    summary = summarize(batch_norm_cfg.model)
    assert summary["flops_per_sample"] == counter.get_total_flops()
    without = summarize(ridge_cfg(norm="batch").model)
    spectrum_flops = 2 * 4 * model.pooled.spectrum.num_modes * 3
    assert summary["pooled_branch"]["flops"] == without["pooled_branch"]["flops"] + (
        # the binning; 3·4 more inputs to the ridge (4 outputs) and to dense0 (8 units)
        spectrum_flops + 2 * 3 * 4 * 4 + 2 * 3 * 4 * 8
    )

    # Training sets it from the shards before the ridge's fit; the saved model carries it.
    cfg = tiny_cfg(model={"head": "gaussian", "pooled": POOLED | {"counts_spectrum": True}})
    train(cfg, shards_dir=shards, run_dir=tmp_path / "run")
    saved = load_model_file(tmp_path / "run/model.pt").pooled.counts_spectrum
    assert bool(saved.transform_set) and bool(saved.log1p)
    np.testing.assert_allclose(saved.input_mean.numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(saved.input_std.numpy(), std, rtol=1e-6)
