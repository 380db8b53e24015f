"""Where a trained CNN's knowledge of each known-answer parameter is, and what hides the
lognormal's σ from it (docs/known_answer.md, "Case (b)" and "Case (c)").

    python benchmarks/known_answer_probes.py \
        --run results-known-answer/studies/known_answer/lr0.001/run \
        --shards results-known-answer/shards

Prints test MAE (unitPar) per parameter of ridge probes, each fitted on the training split:
1. the CNN itself on train / val / test, and a ridge on the input of its last layer;
2. ridges on the pooled branch's global statistics (per channel those model.pooled takes, of the
   input and of every block's output), tap by tap and all together, trained and untrained;
3. on the lognormal channel (1) as the network sees it, σ from the box's mean and std plus the
   means of LeakyReLU(z − c) of the standardised field z, and with one step of a conv block
   added before the average (a max-pool, a channel mix, a 3³ smoothing or sharpening filter);
4. the conditioning of σ in per-voxel features of channel 1 (13 LeakyReLU thresholds);
5. with --pointwise, a network of per-voxel features trained by AdamW (~10 min on 2 cores): a
   1×1×1 conv 4 → 16 and LeakyReLU averaged over the box, beside each channel's mean and std,
   batch-normalised into a 64-unit MLP, 30 epochs of batches of 16 at lr 1e-3 (cosine).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import h5py
import numpy as np
import torch
from scipy.ndimage import uniform_filter
from torch.utils.data import DataLoader

from cosmocub.data.dataset import open_split
from cosmocub.evaluation.baselines import ridge_predictions
from cosmocub.models.model_factory import build_model, load_model_file
from cosmocub.models.pooling import tap_channels

SPLITS = ("train", "val", "test")
THRESHOLDS = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])


def _mae(pred: np.ndarray, true: np.ndarray) -> str:
    return " ".join(f"{v:.3f}" for v in np.abs(pred - true).mean(axis=0))


def _outputs(model: torch.nn.Module, shards: str, split: str, hook_on: torch.nn.Module) -> tuple:
    """(predictions, targets, inputs of `hook_on`) over a split, in order."""
    captured: list[np.ndarray] = []

    def keep(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        first = inputs[0]  # the pooled branch takes its taps' statistics as a list
        first = torch.cat(first, dim=1) if isinstance(first, list) else first
        captured.append(first.numpy().copy())

    handle = hook_on.register_forward_hook(keep)
    preds, targets = [], []
    with torch.inference_mode():
        for x, y in DataLoader(open_split(shards, split, model.config), batch_size=32):
            preds.append(model(x).float().numpy())
            targets.append(y.numpy())
    handle.remove()
    return np.concatenate(preds), np.concatenate(targets), np.concatenate(captured)


def probe_network(run: str, shards: str) -> None:
    trained = load_model_file(f"{run}/model.pt").eval()
    last = [m for m in trained.modules() if isinstance(m, torch.nn.Linear)][-1]
    out = {s: _outputs(trained, shards, s, last) for s in SPLITS}
    print("1. the CNN (amplitude slope sigma f_nl)")
    for split, (pred, true, _) in out.items():
        print(f"   {split}: {_mae(pred[:, : true.shape[1]], true)}")
    for split in ("val", "test"):
        probe = ridge_predictions(out["train"][2], out["train"][1], out[split][2])
        print(f"   ridge on the last layer's input, {split}: {_mae(probe, out[split][1])}")
    torch.manual_seed(123)
    untrained = build_model(trained.config).eval()
    print("2. ridges on the pooled branch's moments (test)")
    for label, model in (("trained", trained), ("untrained", untrained)):
        data = {s: _outputs(model, shards, s, model.pooled) for s in ("train", "test")}
        start = 0
        for tap, channels in tap_channels(model.config).items():
            width = model.config.pooled.per_channel * channels  # the branch's statistics
            cols = slice(start, start + width)
            start += width
            probe = ridge_predictions(
                data["train"][2][:, cols], data["train"][1], data["test"][2][:, cols]
            )
            print(f"   {label} {tap}: {_mae(probe, data['test'][1])}")
        probe = ridge_predictions(data["train"][2], data["train"][1], data["test"][2])
        print(f"   {label} all taps: {_mae(probe, data['test'][1])}")


def _leaky(z: np.ndarray) -> np.ndarray:
    return np.where(z > 0, z, 0.3 * z)


def _maxpool(a: np.ndarray) -> np.ndarray:
    n = a.shape[-1] // 2
    return a.reshape(n, 2, n, 2, n, 2).max(axis=(1, 3, 5))


def _shape_statistics(
    field: np.ndarray, *, pool: bool, thresholds: np.ndarray = THRESHOLDS
) -> np.ndarray:
    z = (field - field.mean()) / field.std()
    acts = [_leaky(z - c) for c in thresholds]
    acts = [_maxpool(a) for a in acts] if pool else acts
    return np.r_[field.mean(), field.std(), [a.mean() for a in acts]]


def probe_lognormal(shards: str) -> None:
    """σ (unitPar slot 2) from statistics of channel 1 of the stored (log1p) samples."""
    variants: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool]] = {
        "per voxel, then the box average": (lambda x: x[1], False),
        "+ 2^3 max-pool after the activation": (lambda x: x[1], True),
        "+ half of channel 0 mixed in": (
            lambda x: x[1] + 0.5 * x[0] * x[1].std() / x[0].std(),
            False,
        ),
        "+ 3^3 smoothing filter": (lambda x: uniform_filter(x[1], 3, mode="wrap"), False),
        "+ 3^3 sharpening filter": (
            lambda x: x[1] - 0.5 * uniform_filter(x[1], 3, mode="wrap"),
            False,
        ),
    }
    data = {}
    for split in ("train", "test"):
        with h5py.File(f"{shards}/{split}.h5", "r") as f:
            data[split] = (f["x"][:].astype(np.float64), f["y"][:, 2:3])
    print("3. sigma from channel 1's statistics (test MAE)")
    fine = np.linspace(-3.0, 3.0, 13)
    feats = {
        s: np.stack([_shape_statistics(x[1], pool=False, thresholds=fine) for x in data[s][0]])
        for s in data
    }
    probe = ridge_predictions(feats["train"], data["train"][1], feats["test"])
    print(f"   per voxel (13 thresholds), then the box average: {_mae(probe, data['test'][1])}")
    for name, (make, pool) in variants.items():
        feats = {
            s: np.stack([_shape_statistics(make(x), pool=pool) for x in data[s][0]]) for s in data
        }
        probe = ridge_predictions(feats["train"], data["train"][1], feats["test"])
        print(f"   {name}: {_mae(probe, data['test'][1])}")


def conditioning(shards: str) -> None:
    """How far down the covariance of per-voxel features σ sits: the eigenvalues of the
    standardised [mean, std, 13 LeakyReLU means] of channel 1 over the training universes, and
    the share of σ's variance each direction explains (gradient descent on a linear readout
    moves along a direction at a rate proportional to its eigenvalue)."""
    with h5py.File(f"{shards}/train.h5", "r") as f:
        x, y = f["x"][:, 1].astype(np.float64), f["y"][:, 2]
    mu, sd = x.mean(), x.std()
    cs = np.linspace(-3.0, 3.0, 13)
    feats = np.array(
        [np.r_[s.mean(), s.std(), [_leaky((s - mu) / sd - c).mean() for c in cs]] for s in x]
    )
    z = (feats - feats.mean(0)) / feats.std(0)
    eigenvalues, vectors = np.linalg.eigh(np.cov(z.T))
    cov = vectors.T @ (z.T @ (y - y.mean())) / len(y)
    share = cov**2 / np.maximum(eigenvalues, 1e-30) / y.var()
    print("4. per-voxel features of channel 1: eigenvalue, share of var(sigma) it explains")
    for i in np.argsort(eigenvalues)[::-1]:
        if eigenvalues[i] > 1e-10:
            print(f"   {eigenvalues[i]:.2e}  {share[i]:.3f}")


def train_pointwise(shards: str, *, epochs: int = 30, lr: float = 1e-3) -> None:
    """Section 5: can gradient descent find σ in per-voxel features the ridge reads?"""
    from torch import nn

    torch.manual_seed(0)
    data = {}
    for split in SPLITS:
        with h5py.File(f"{shards}/{split}.h5", "r") as f:
            data[split] = (torch.tensor(f["x"][:], dtype=torch.float32), torch.tensor(f["y"][:]))
    mu = data["train"][0].mean(dim=(0, 2, 3, 4), keepdim=True)
    sd = data["train"][0].std(dim=(0, 2, 3, 4), keepdim=True)
    data = {k: ((x - mu) / sd, y) for k, (x, y) in data.items()}

    class Pointwise(nn.Module):
        def __init__(self, width: int = 16) -> None:
            super().__init__()
            self.point = nn.Sequential(nn.Conv3d(4, width, 1), nn.LeakyReLU(0.3))
            self.norm = nn.BatchNorm1d(width + 8)
            self.head = nn.Sequential(nn.Linear(width + 8, 64), nn.LeakyReLU(0.3), nn.Linear(64, 4))

        def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
            moments = [x_bcdhw.mean(dim=(2, 3, 4)), x_bcdhw.std(dim=(2, 3, 4))]
            pooled = self.point(x_bcdhw).mean(dim=(2, 3, 4))
            return self.head(self.norm(torch.cat([pooled, *moments], 1)))

    net = Pointwise()
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    x_train, y_train = data["train"]
    for _ in range(epochs):
        net.train()
        perm = torch.randperm(len(x_train))
        for i in range(0, len(x_train), 16):
            batch = perm[i : i + 16]
            loss = ((net(x_train[batch]) - y_train[batch]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    net.eval()
    print(f"5. per-voxel network, {epochs} epochs (amplitude slope sigma f_nl)")
    with torch.no_grad():
        for split, (x, y) in data.items():
            print(f"   {split}: {_mae(net(x).numpy(), y.numpy())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a trained run folder (model.pt)")
    parser.add_argument("--shards", required=True, help="the known-answer shards it trained on")
    parser.add_argument("--pointwise", action="store_true", help="also section 5 (~10 min)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    probe_network(args.run, args.shards)
    probe_lognormal(args.shards)
    conditioning(args.shards)
    if args.pointwise:
        train_pointwise(args.shards)


if __name__ == "__main__":
    main()
