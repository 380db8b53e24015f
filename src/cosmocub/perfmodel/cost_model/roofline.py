"""Compute on an accelerator from its specification, without a hand-set efficiency: every kernel
of a CosmoFlow step takes max(its FLOPs at the dtype's achievable rate, its bytes at the
achievable HBM bandwidth) + a floor per kernel (hardware_specs: the shares and floor, each with
its source). The achievable rate is a 3D convolution's (conv3d_share of peak, from a measured
3D U-Net) for the convolutions and their gradients, a GEMM's (flops_share) for the dense layers,
the fp32 vector rate for the rest. Bytes are counted per kernel from the layer shapes, as
PyTorch's eager kernels read and write them under AMP (activations and weight copies in fp16,
master weights, their gradients and the optimizer's state in fp32; max pooling keeps int64
indices for backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from cosmocub.config import ModelConfig

INDEX_BYTES = 8  # max_pool3d_with_indices: an int64 index per pooled value
MASTER_BYTES = 4  # fp32 parameters and gradients under AMP
# Per parameter, what the update kernels read and write besides the gradient's unscale
# (GradScaler: read and write the fp32 gradient): SGD with momentum p, g, m read, p, m written.
UNSCALE_BYTES_PER_PARAM = 2 * MASTER_BYTES
# GradScaler's unscale, its inf check and its scale update, then one multi-tensor update.
OPTIMIZER_KERNELS = 4


@dataclass(frozen=True)
class Kernel:
    """One kernel launch: FLOPs, bytes it reads + writes, whether its FLOPs run on the matrix
    units at the activations' dtype (convolutions, GEMMs) or as fp32 vector work, and whether it
    is a 3D convolution (forward, or its input or weight gradient: a transposed convolution and
    a reduction over the voxels), priced at the 3D-convolution rate rather than a GEMM's."""

    name: str
    flops: float
    nbytes: float
    matrix: bool = False
    conv3d: bool = False


def _cast(n: float, act: int) -> Kernel:
    """AMP's cast of an fp32 parameter to the activations' dtype (each forward)."""
    return Kernel("cast", 0.0, n * (MASTER_BYTES + act))


def _grad_cast(n: float, act: int) -> Kernel:
    """A low-precision weight gradient accumulated into the fp32 .grad."""
    return Kernel("grad to fp32", 0.0, n * (act + MASTER_BYTES))


def conv_block_kernels(
    *,
    cin: int,
    cout: int,
    voxels: float,
    batch: int,
    kernel_size: int,
    act: int,
    batch_norm: bool,
    first: bool,
    train: bool,
) -> list[Kernel]:
    """Conv3d (same padding) → bias or batch norm → LeakyReLU → MaxPool3d(2) on `voxels`
    output voxels a sample; backward: pooling's scatter (into a zeroed gradient), the
    activation's, the bias's reduction, the weight gradient, and (not for the first block,
    whose input needs none) the input gradient."""
    x, y = batch * cin * voxels, batch * cout * voxels  # values in, out of the conv
    w = cout * cin * kernel_size**3
    flops = 2.0 * kernel_size**3 * cin * cout * voxels * batch
    ks = [_cast(w, act), _cast(cout, act), Kernel("conv", flops, act * (x + y + w), True, True)]
    norm_or_bias = [Kernel("norm stats", 2 * y, act * y), Kernel("norm", 2 * y, 2 * act * y)]
    ks += norm_or_bias if batch_norm else [Kernel("bias", y, 2 * act * y)]
    ks += [
        Kernel("leaky relu", y, 2 * act * y),
        Kernel("max pool", y, act * (y + y / 8) + INDEX_BYTES * y / 8),
    ]
    if not train:
        return ks
    ks += [
        Kernel("zero pool grad", 0.0, act * y),
        Kernel("max pool bwd", 0.0, act * y / 4 + INDEX_BYTES * y / 8),
        Kernel("leaky relu bwd", y, 3 * act * y),
    ]
    if batch_norm:
        ks += [Kernel("norm bwd stats", 4 * y, 2 * act * y), Kernel("norm bwd", 4 * y, 3 * act * y)]
    else:
        ks += [Kernel("bias grad", y, act * y), _grad_cast(cout, act)]
    ks += [Kernel("conv wgrad", flops, act * (x + y + w), True, True), _grad_cast(w, act)]
    if not first:
        ks.append(Kernel("conv dgrad", flops, act * (x + y + w), True, True))
    return ks


def dense_kernels(
    *, n_in: int, n_out: int, batch: int, act: int, dropout: bool, train: bool
) -> list[Kernel]:
    """Linear (GEMM with its bias in the epilogue) → LeakyReLU → Dropout, and their backward
    (two GEMMs, the bias's reduction, the activation's and dropout's gradients)."""
    w = n_in * n_out
    x, y = batch * n_in, batch * n_out
    gemm = 2.0 * batch * w
    ks = [_cast(w, act), _cast(n_out, act), Kernel("linear", gemm, act * (x + w + y), True)]
    ks.append(Kernel("leaky relu", y, 2 * act * y))
    if dropout:
        ks.append(Kernel("dropout", y, 2 * act * y + y))
    if not train:
        return ks
    if dropout:
        ks.append(Kernel("dropout bwd", y, 2 * act * y + y))
    ks += [
        Kernel("leaky relu bwd", y, 3 * act * y),
        Kernel("linear dgrad", gemm, act * (y + w + x), True),
        Kernel("linear wgrad", gemm, act * (y + x + w), True),
        Kernel("bias grad", y, act * y),
        _grad_cast(w, act),
        _grad_cast(n_out, act),
    ]
    return ks


def step_kernels(
    model_cfg: ModelConfig, *, batch: int, spatial: int, act: int, train: bool = True
) -> dict[str, list[Kernel]]:
    """The kernels of one step on one rank, per layer as compute's layer times name them: each
    conv block on the rank's 1/spatial of the sample's voxels, and the head (the dense layers,
    the output, tanh and the loss) on the gathered features, replicated on every rank."""
    if model_cfg.pooled.enabled:
        raise ValueError(
            f"key 'model.pooled.stats': {model_cfg.pooled.stats!r}; the roofline knows the "
            "plain CosmoFlow (blocks, then the head on the flattened features) only"
        )
    layers: dict[str, list[Kernel]] = {}
    channels, side = model_cfg.in_channels, model_cfg.input_size
    for i in range(model_cfg.num_conv_blocks):
        filters = model_cfg.base_filters * 2**i
        layers[f"block{i}"] = conv_block_kernels(
            cin=channels,
            cout=filters,
            voxels=side**3 / spatial,
            batch=batch,
            kernel_size=model_cfg.kernel_size,
            act=act,
            batch_norm=model_cfg.batch_norm,
            first=i == 0,
            train=train,
        )
        channels, side = filters, side // 2
    head: list[Kernel] = []
    width = channels * side**3
    for size in model_cfg.dense_sizes:
        head += dense_kernels(
            n_in=width,
            n_out=size,
            batch=batch,
            act=act,
            dropout=model_cfg.dropout > 0,
            train=train,
        )
        width = size
    out = model_cfg.num_outputs
    head += dense_kernels(n_in=width, n_out=out, batch=batch, act=act, dropout=False, train=train)
    # tanh · scale, the loss (difference, square, mean), and their backward: tiny kernels
    head += [Kernel("output", batch * out, 4 * act * batch * out)] * (6 if train else 2)
    layers["head"] = head
    return layers


def kernel_seconds(
    kernel: Kernel,
    *,
    conv3d_flops: float,
    matrix_flops: float,
    vector_flops: float,
    hbm: float,
    floor_s: float,
) -> float:
    """max(FLOPs at the 3D-convolution, matrix (GEMM) or vector rate, bytes at the HBM rate)
    + the floor."""
    rate = vector_flops
    if kernel.matrix:
        rate = conv3d_flops if kernel.conv3d else matrix_flops
    return max(kernel.flops / rate, kernel.nbytes / hbm) + floor_s


def update_kernels(parameters: int, update_bytes_per_param: float) -> list[Kernel]:
    """The optimizer's step on the fp32 master weights: GradScaler's unscale and checks, then
    the update, memory-bound, each parameter's bytes read and written once."""
    per_param = update_bytes_per_param + UNSCALE_BYTES_PER_PARAM
    share = parameters * per_param / OPTIMIZER_KERNELS
    return [Kernel("update", 0.0, share) for _ in range(OPTIMIZER_KERNELS)]
