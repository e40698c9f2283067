"""Per-call time of the vision models of examples/vision.py: eager PyTorch, the `.pte` on
both runtimes, and the same model written with MLX's own ops (``mx.conv2d`` for every
convolution, depthwise included: what a port to MLX by hand runs), as ratios in one run.
On MLX's CPU etmlx runs depthwise convolutions as sums of shifted products
(runtime_shim/mlx_ops/convolution.py); the MLX column shows what MLX's own kernel costs.
Swin has no MLX column (no depthwise convolution to compare).

    python bench/bench_vision.py [--size 224]
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import etmlx.native  # noqa: E402
import mlx.core as mx  # noqa: E402
import mlx.nn as mnn  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402
from etmlx.timing import median_seconds  # noqa: E402

from examples import vision  # noqa: E402
from timing import print_table  # noqa: E402

CALLS = 20


def _array(tensor) -> mx.array:
    return mx.array(tensor.detach().numpy())


def _conv(conv: torch.nn.Conv2d):
    """``conv`` as ``mx.conv2d`` on channels-last arrays."""
    weight = _array(conv.weight.permute(0, 2, 3, 1))
    bias = None if conv.bias is None else _array(conv.bias)

    def run(x):
        y = mx.conv2d(x, weight, stride=conv.stride, padding=conv.padding, groups=conv.groups)
        return y if bias is None else y + bias

    return run


def _batch_norm(norm: torch.nn.BatchNorm2d):
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    scale, shift = _array(scale), _array(norm.bias - norm.running_mean * scale)
    return lambda x: x * scale + shift


def _linear(linear: torch.nn.Linear):
    weight, bias = _array(linear.weight.T), _array(linear.bias)
    return lambda x: x @ weight + bias


def _layer_norm(norm: torch.nn.LayerNorm):
    weight, bias = _array(norm.weight), _array(norm.bias)
    return lambda x: mx.fast.layer_norm(x, weight, bias, norm.eps)


def mlx_model(module):
    """The model with MLX's own ops on channels-last arrays, or None for Swin."""
    layers = {torch.nn.Conv2d: _conv, torch.nn.BatchNorm2d: _batch_norm, torch.nn.Linear: _linear,
              torch.nn.LayerNorm: _layer_norm, torch.nn.ReLU6: lambda _: (lambda x: mx.clip(x, 0, 6)),
              torch.nn.GELU: lambda _: (lambda x: mnn.gelu(x))}

    def sequence(seq):
        steps = [layers[type(m)](m) for m in seq]

        def run(x):
            for step in steps:
                x = step(x)
            return x

        return run

    if isinstance(module, vision.MobileNet):
        stem = sequence(module.stem)
        blocks = [(sequence(b.layers), b.residual) for b in module.blocks]
        body = [stem] + [(lambda x, f=f, r=r: x + f(x) if r else f(x)) for f, r in blocks]
    elif isinstance(module, vision.ConvNeXt):
        def block(b):
            depthwise, norm, mlp, scale = _conv(b.depthwise), _layer_norm(b.norm), sequence(b.mlp), _array(b.scale)
            return lambda x: x + scale * mlp(norm(depthwise(x)))

        body = [_conv(module.stem), *map(block, module.stage1), _conv(module.down), *map(block, module.stage2),
                _layer_norm(module.norm)]
    else:
        return None
    head = _linear(module.head)

    def forward(x):
        for step in body:
            x = step(x)
        return head(mx.mean(x, axis=(1, 2)))

    return mx.compile(forward)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    args = parser.parse_args()
    print(f"MLX CPU; BLAS: {preload_openblas()}; input 1x3x{args.size}x{args.size}, median of {CALLS} calls")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("mobilenet", "convnext", "swin"):
            module, (x,), _ = getattr(vision, name)(args.size)
            path = os.path.join(tmp, f"{name}.pte")
            etmlx.export(module, (x,), path)
            with torch.no_grad():
                expected = module(x).numpy()
                rows = [("eager PyTorch", median_seconds(lambda: module(x), repeat=CALLS))]
            errors = []
            for runtime in etmlx.RUNTIMES:
                program = etmlx.load(path, runtime=runtime)
                errors.append(np.abs(program.forward(x).numpy() - expected).max())
                rows.append((f"etmlx {runtime}", median_seconds(lambda: program.forward(x), repeat=CALLS)))
            by_hand = mlx_model(module)
            if by_hand is not None:
                x_last = mx.array(x.permute(0, 2, 3, 1).numpy())
                errors.append(np.abs(np.array(by_hand(x_last)) - expected).max())
                seconds = median_seconds(lambda: mx.eval(by_hand(x_last)), repeat=CALLS)
                rows.append(("MLX's own ops (mx.conv2d)", seconds))
            print(f"\n{name} (largest difference from eager: {max(errors):.1e})")
            print_table(rows, "eager PyTorch")


if __name__ == "__main__":
    main()
