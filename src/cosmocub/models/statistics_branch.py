"""CosmoFlow's statistics branch (model.pooled): whole-sample moments per channel of chosen feature
maps and their log power spectrum, normalised, for the dense head to read beside the flattened
features.

Plain layers only: `parallelize_cosmoflow` swaps the moments for spatially merged ones.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.cosmology.power import log_k_edges, rfft_bins
from cosmocub.data.features import k_magnitude
from cosmocub.parallel.spatial_moments import central_moments, channel_statistics

STD_EPS = 1e-5  # under the square root: a finite gradient even for a constant map


class GlobalMoments(nn.Module):
    """(B, C, D, H, W) → (B, order·C): each channel's whole-sample statistics over D, H and W
    up to `order` (parallel.spatial_moments.channel_statistics): 1 the mean; 2 and the standard
    deviation sqrt(var + eps) (population variance); from 3 the standardised central moments
    (parallel.spatial_moments.central_moments)."""

    def __init__(self, *, order: int, eps: float = STD_EPS) -> None:
        super().__init__()
        self.order, self.eps = order, eps

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        dims = (2, 3, 4)
        if self.order == 1:
            return x_bcdhw.mean(dim=dims)  # (B, C)
        if self.order == 2:
            var, mean = torch.var_mean(x_bcdhw, dim=dims, correction=0)  # (B, C) each
            return channel_statistics(mean, [var], order=2, eps=self.eps)
        # Higher orders: the same autograd function a spatial split merges (it keeps the block
        # and the moments for backward, no per-power tensors), so both save the same bytes.
        mean, central = central_moments(x_bcdhw, self.order)
        return channel_statistics(mean, central, order=self.order, eps=self.eps)  # (B, order·C)

    def extra_repr(self) -> str:
        return f"order {self.order}"


class LogPowerSpectrum(nn.Module):
    """(B, C, S, S, S) → (B, bins·C), bin-major like `GlobalMoments`: per channel the log of its
    power spectrum, the mean over the modes of each log-spaced |k| bin (the bins of the P(k)
    features, data.features) of |FFT(x − mean)|²/S³, in float32 whatever the input's dtype.

    Why in the network: a CNN's global statistics of its feature maps hold the spectrum only
    as filtered band powers it has to learn, and on whole boxes it did not
    (docs/explanation/known_answer.md:
    its error on Ω_m stayed that of the input's one-point moments, where P(k) with them does
    better). Taken whole, the spectrum of the input the network reads, the log-density P(k), is
    a fixed feature, so what the network adds beyond it is what it learned. The FFT is
    periodic: on a whole periodic box the spectrum is exact, on a crop it carries the crop's
    edges (as the P(k) features of crops do). A bin with no mode on a small cube reads log of
    the floor `eps`."""

    def __init__(self, *, size: int, bins: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.size, self.bins, self.eps = size, bins, eps
        k = k_magnitude(size)  # (S, S, S//2 + 1): the rfftn grid
        rows, which, weight = rfft_bins(k, log_k_edges(size, float(size), bins))
        modes = np.bincount(which, weights=weight, minlength=bins)
        # The mean per bin as one (modes, bins) matrix: a mode's weight over its bin's modes.
        # Dense: 5 MB at 64³ and 10 bins, one matmul a forward.
        matrix = np.zeros((k.size, bins), dtype=np.float32)
        matrix[rows, which] = weight / modes[which]
        self.num_modes = k.size
        # torch.tensor, not from_numpy: under a device context (the summary's meta) it lands there.
        self.register_buffer("bin_matrix", torch.tensor(matrix), persistent=False)

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        b, c = x_bcdhw.shape[:2]
        if x_bcdhw.shape[2:] != (self.size,) * 3:
            raise ValueError(
                f"LogPowerSpectrum: a sample of {list(x_bcdhw.shape[2:])} voxels, built for "
                f"{self.size}³ (model.input_size)"
            )
        x = x_bcdhw.float()
        x = x - x.mean(dim=(2, 3, 4), keepdim=True)
        field_k = torch.fft.rfftn(x, dim=(2, 3, 4), norm="ortho")  # |.|² sums to S³·var
        power = (field_k.real.square() + field_k.imag.square()).flatten(2)  # (B, C, modes)
        banded = power.reshape(b * c, -1) @ self.bin_matrix  # (B·C, bins)
        out = torch.log(banded.reshape(b, c, self.bins) + self.eps)
        return out.transpose(1, 2).flatten(1)  # (B, bins·C): all channels' first bin, …

    def extra_repr(self) -> str:
        return f"{self.size}³, {self.bins} bins"


class CountsSpectrum(nn.Module):
    """(B, C, S, S, S) → (B, bins·C), bin-major: per channel the log power spectrum of the count
    overdensity n/n̄ − 1 (n̄ the sample's mean count), in the bins of `spectrum`, with n recovered
    from the network's input by undoing the shards' standardisation and, where they hold
    log1p counts, the log: the classical baselines' P(k) feature (data.features `pk`).

    Why beside the log-density spectrum: on the synthetic whole boxes the two spectra together
    with the one-point statistics are the best classical fit (Ω_m 0.111 per universe, against
    0.131 without the counts' P(k): docs/explanation/known_answer.md). The network reads log1p
    counts, whose
    spectrum it can take whole; the counts' own spectrum is a different function of the field,
    one a conv stack would have to learn through an exponential.

    The standardisation is the shards' (stats.json, and the training shard's `log1p` attribute:
    data.dataset.read_input_transform), set once before the first step (`set_input_transform`,
    train/build.py) and saved with the weights, so an evaluation of the saved model reads it
    from there; `transform_set` says whether it was. Float32 throughout: expm1 of a float16
    log1p count is exact enough (~10⁻³ relative), and the counts span orders of magnitude."""

    def __init__(self, spectrum: LogPowerSpectrum, channels: int) -> None:
        super().__init__()
        self.spectrum = spectrum  # shared with the log-density spectrum: one bin matrix
        self.register_buffer("input_mean", torch.zeros(channels))
        self.register_buffer("input_std", torch.ones(channels))
        self.register_buffer("log1p", torch.ones((), dtype=torch.bool))
        self.register_buffer("transform_set", torch.zeros((), dtype=torch.bool))

    def set_input_transform(self, mean: list[float], std: list[float], *, log1p: bool) -> None:
        """The shards' per-channel standardisation (x = (v − mean)/std, v the stored value) and
        whether v is log1p of the counts."""
        channels = self.input_mean.numel()
        if len(mean) != channels or len(std) != channels:
            raise ValueError(
                f"CountsSpectrum: the shards standardise {len(mean)} channels "
                f"(mean) and {len(std)} (std), the model reads {channels}"
            )
        self.input_mean.copy_(torch.tensor(mean, dtype=torch.float32))
        self.input_std.copy_(torch.tensor(std, dtype=torch.float32))
        self.log1p.fill_(log1p)
        self.transform_set.fill_(True)

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        shape = (1, -1, 1, 1, 1)
        values = x_bcdhw.float() * self.input_std.view(shape) + self.input_mean.view(shape)
        counts = torch.where(self.log1p, torch.expm1(values), values)
        mean = counts.mean(dim=(2, 3, 4), keepdim=True)
        # An empty channel (n̄ = 0) has no overdensity: it reads the spectrum's floor.
        overdensity = counts / torch.where(mean > 0, mean, torch.ones_like(mean))
        return self.spectrum(overdensity)  # the spectrum takes off the mean: n/n̄ − 1

    def extra_repr(self) -> str:
        return (
            f"{self.input_mean.numel()} channels, log1p={bool(self.log1p)}, "
            f"transform_set={bool(self.transform_set)}"
        )


def tap_channels(cfg: ModelConfig) -> dict[str, int]:
    """Channels of each pooled feature map, by tap name, in the order the model computes them:
    "input", then per conv block i "conv{i}" (its convolution's output, before the norm,
    activation and max-pool; model.pooled.taps "convs") and "block{i}" (its output; taps
    "blocks")."""
    out: dict[str, int] = {}
    if "input" in cfg.pooled.taps:
        out["input"] = cfg.in_channels
    for i in range(cfg.num_conv_blocks):
        filters = cfg.base_filters * 2**i
        if "convs" in cfg.pooled.taps:
            out[f"conv{i}"] = filters
        if "blocks" in cfg.pooled.taps:
            out[f"block{i}"] = filters
    return out


class GroupWhitening(nn.Module):
    """(B, F) → (B, F): the features `index` (G, k) groups, each group's k features standardised
    and decorrelated (ZCA) by running estimates of their mean and covariance over the samples
    seen in training (by default the cumulative average of every batch so far, which for
    batches of one size is the exact mean and population covariance of all their samples; with
    `momentum` an exponential average, that share a batch, started at the first batch):
    x_g ↦ C_g^(−1/2) · (x_g − μ_g) / s_g with C_g the correlation and s_g the deviations. The
    estimates are taken without gradient, so a step's map is linear and fixed, as batch norm's
    in eval mode. Why: a lognormal field's σ lies in a combination of its mean, deviation,
    skewness and kurtosis whose variance over the training universes is ~10⁻³ of the leading
    one's (docs/explanation/known_answer.md); gradient descent moves along a direction at a rate
    proportional to its variance, so a per-feature norm leaves that combination unreached in a
    few thousand steps, while whitened it is as quick as any other.

    `eps` is added to the correlation's diagonal (a floor on its eigenvalues, relative);
    `var_eps` under each deviation keeps features that no sample moves (float noise of a
    statistic fixed by construction) near zero instead of blowing their noise up to unit size.

    Why cumulative: the input tap's statistics are the data's, one distribution all through
    training, and the directions whitening amplifies most are the ones its estimate gets least
    right. An exponential average at 0.01 a batch rests on the last ~100 batches; on whole
    64³ boxes (moments to the 6th and a 10-bin spectrum, batches of 8) that moved the whitened
    validation features by up to half their spread in 100 steps at lr 7.8·10⁻⁶, and the
    predicted Ω_m's mean with them by 0.25 (docs/explanation/known_answer.md, "The log-density
    P(k)").
    """

    def __init__(
        self,
        index: torch.Tensor,
        *,
        momentum: float | None = None,
        eps: float = 1e-5,
        var_eps: float = 1e-10,
    ) -> None:
        super().__init__()
        groups, k = index.shape
        self.momentum, self.eps, self.var_eps = momentum, eps, var_eps
        self.register_buffer("index", index.clone(), persistent=False)
        self.register_buffer("running_mean", torch.zeros(groups, k, dtype=torch.float64))
        self.register_buffer(
            "running_cov", torch.eye(k, dtype=torch.float64).expand(groups, k, k).clone()
        )
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    @torch.no_grad()
    def _track(self, grouped: torch.Tensor) -> None:
        x = grouped.double()  # (B, G, k)
        mean = x.mean(0)
        centred = x - mean
        cov = torch.einsum("bgi,bgj->gij", centred, centred) / x.shape[0]
        # The first batch sets the estimates (a step of 1); no .item(): no wait on the device.
        if self.momentum is None:  # cumulative: the n-th batch weighs 1/n
            m = 1.0 / (self.num_batches_tracked + 1).to(x.dtype)
        else:
            m = torch.where(self.num_batches_tracked == 0, 1.0, self.momentum).to(x.dtype)
        shift = mean - self.running_mean  # the new batch moves the mean: its outer product
        spread = shift[:, :, None] * shift[:, None, :]
        self.running_cov.mul_(1 - m).add_(m * cov + m * (1 - m) * spread)
        self.running_mean.add_(m * shift)
        self.num_batches_tracked += 1

    def _whitening(self) -> torch.Tensor:
        """(G, k, k) W with W (x − μ) whitened: C^(−1/2) diag(1/s), C the correlation."""
        sd = torch.sqrt(torch.diagonal(self.running_cov, dim1=1, dim2=2) + self.var_eps)  # (G, k)
        corr = self.running_cov / (sd[:, :, None] * sd[:, None, :])
        k = corr.shape[-1]
        floor = self.eps * torch.eye(k, dtype=corr.dtype, device=corr.device)
        values, vectors = torch.linalg.eigh(corr + floor)
        inv_sqrt = vectors @ torch.diag_embed(values.rsqrt()) @ vectors.transpose(1, 2)
        return inv_sqrt / sd[:, None, :]

    def forward(self, x_bf: torch.Tensor) -> torch.Tensor:
        grouped = x_bf[:, self.index]  # (B, G, k)
        if self.training and x_bf.shape[0] > 1:
            self._track(grouped)
        w = self._whitening().to(x_bf.dtype)
        centred = grouped - self.running_mean.to(x_bf.dtype)
        out = torch.einsum("gij,bgj->bgi", w, centred)  # (B, G, k)
        # The groups partition the features: each lands back in its own column.
        return out.new_zeros(x_bf.shape).index_copy(1, self.index.flatten(), out.flatten(1))

    def extra_repr(self) -> str:
        groups, k = self.index.shape
        average = "cumulative" if self.momentum is None else f"momentum={self.momentum}"
        return f"{groups} groups of {k}, {average}, eps={self.eps}"


def whitening_groups(channels: int, per_channel: int) -> torch.Tensor:
    """(C, k) indices into a tap's statistics (blocks of C: all the means, then all the
    deviations, …): one group per channel, its k statistics."""
    return torch.tensor(
        [[j * channels + c for j in range(per_channel)] for c in range(channels)], dtype=torch.long
    )


class TapRidge(nn.Module):
    """A fixed affine map (B, F) → (B, P) of the input tap's statistics: the ridge regression
    that model.pooled.tap_ridge starts the means from (pre-tanh, so that tanh · output_scale of
    it is the ridge's prediction). Buffers, not parameters: fitted once on the training
    universes (train/ridge_start.py, `set_fit`), held fixed by every optimizer, and saved with
    the model. Unfitted it is zero, and the model is what it would be without it."""

    def __init__(self, features: int, outputs: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(outputs, features))
        self.register_buffer("bias", torch.zeros(outputs))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    def set_fit(self, weight_pf: torch.Tensor, bias_p: torch.Tensor) -> None:
        if weight_pf.shape != self.weight.shape or bias_p.shape != self.bias.shape:
            raise ValueError(
                f"TapRidge: fit of shape {tuple(weight_pf.shape)} + {tuple(bias_p.shape)}, "
                f"expected {tuple(self.weight.shape)} + {tuple(self.bias.shape)}"
            )
        self.weight.copy_(weight_pf)
        self.bias.copy_(bias_p)
        self.fitted.fill_(True)

    def forward(self, stats_bf: torch.Tensor) -> torch.Tensor:
        # float32 whatever the autocast: the spectrum's logs and the moments differ in scale by
        # orders of magnitude, and the ridge's weights undo that.
        return nn.functional.linear(stats_bf.float(), self.weight, self.bias)

    def extra_repr(self) -> str:
        outputs, features = self.weight.shape
        return f"features={features}, outputs={outputs}, fitted={bool(self.fitted)}"


class PooledBranch(nn.Module):
    """`moments`: a `GlobalMoments` per tap (keys as `tap_channels`); forward(list of their
    outputs, in that order) → (B, num_features), normalised as model.pooled.norm says. "batch":
    batch-normalised when model.batch_norm is on (the statistics differ between samples by a
    small fraction of their size, one universe's mean density against another's, which the
    norm brings to the scale of the other features). "whiten": the input tap's statistics
    whitened per channel (`GroupWhitening`), the blocks' as "batch" does: the input's
    statistics are the data's, the same all through training, so running estimates of their
    covariance hold; a block's move with its weights, and estimates that lag them would
    blow the whitened values up (measured: the outputs pinned at ±output_scale from the
    first epoch on)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        per_channel = cfg.pooled.per_channel
        channels = tap_channels(cfg)
        self.moments = nn.ModuleDict({name: GlobalMoments(order=per_channel) for name in channels})
        bins = cfg.pooled.spectrum_bins
        # The input tap's spectrum, after its moments (CosmoFlow.forward joins the two).
        self.spectrum = LogPowerSpectrum(size=cfg.input_size, bins=bins) if bins else None
        self.counts_spectrum = (
            CountsSpectrum(self.spectrum, channels["input"]) if cfg.pooled.counts_spectrum else None
        )
        # The input tap's statistics per channel: its moments, then its spectra.
        spectra_bins = bins * (2 if self.counts_spectrum is not None else 1)
        input_per_channel = per_channel + spectra_bins
        self.num_features = per_channel * sum(channels.values()) + spectra_bins * channels.get(
            "input", 0
        )
        self.whitened = 0  # the leading features (the input tap's) that `whiten` takes
        self.whiten: nn.Module = nn.Identity()
        if cfg.pooled.norm == "whiten":
            self.whitened = input_per_channel * channels["input"]
            self.whiten = GroupWhitening(whitening_groups(channels["input"], input_per_channel))
        rest = self.num_features - self.whitened
        self.norm: nn.Module = nn.BatchNorm1d(rest) if cfg.batch_norm and rest else nn.Identity()
        input_features = input_per_channel * channels.get("input", 0)
        self.ridge = TapRidge(input_features, cfg.num_outputs) if cfg.pooled.tap_ridge else None

    def input_statistics(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        """The input tap's features: its moments, then with spectrum_bins its log spectrum, then
        with counts_spectrum the counts' log spectrum."""
        moments = self.moments["input"](x_bcdhw)  # (B, k·C)
        if self.spectrum is None:
            return moments
        parts = [moments, self.spectrum(x_bcdhw).to(moments.dtype)]
        if self.counts_spectrum is not None:
            parts.append(self.counts_spectrum(x_bcdhw).to(moments.dtype))
        return torch.cat(parts, dim=1)

    def forward(self, stats: list[torch.Tensor]) -> torch.Tensor:
        features = torch.cat(stats, dim=1)  # (B, num_features)
        if not self.whitened:
            return self.norm(features)
        head, rest = features.split([self.whitened, self.num_features - self.whitened], dim=1)
        return torch.cat([self.whiten(head), self.norm(rest)], dim=1)
