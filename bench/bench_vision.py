"""Per-call time of transformers' image models at a named checkpoint's shape (random
weights: examples/transformers_vision.py's ``NAMED``) as ``.pte`` on both runtimes,
against eager PyTorch in one run; where the time goes in the slowest, by IR operation
(runtime_shim/node_profile.py); and micro-benchmarks of the MLX CPU kernels behind
those operations against PyTorch's, next to the form etmlx runs where it has its own.

    python bench/bench_vision.py [--models ResNet-50 ViT-B/16 ...] [--calls 20] [--breakdowns 3]
"""

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import etmlx.native  # noqa: E402
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402
from etmlx.runtime_shim.mlx_ops import convolution, cpu_math  # noqa: E402
from etmlx.runtime_shim.node_profile import node_seconds  # noqa: E402
from etmlx.timing import median_seconds, medians_in_turns  # noqa: E402

from examples import transformers_vision  # noqa: E402

SHOWN_OPERATIONS = 6


def _outputs(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def time_model(label: str, calls: int, tmp: str) -> dict:
    name, overrides = transformers_vision.NAMED[label]
    module, inputs = transformers_vision.build(name, overrides=overrides)
    path = os.path.join(tmp, f"{name}.pte")
    etmlx.export(module, inputs, path)
    programs = {runtime: etmlx.load(path, runtime=runtime) for runtime in etmlx.RUNTIMES}
    with torch.no_grad():
        expected = _outputs(module(*inputs))
        worst = max(float((a - e).abs().max() / e.abs().max()) for program in programs.values()
                    for a, e in zip(_outputs(program.forward(*inputs)), expected))
        timed = {"eager": lambda: module(*inputs)}
        timed.update({runtime: (lambda p=program: p.forward(*inputs)) for runtime, program in programs.items()})
        row = medians_in_turns(timed, rounds=max(1, calls // 5), block=min(calls, 5))
    return {"label": label, "path": path, "inputs": inputs, "difference": worst, **row}


def print_models(rows: list) -> None:
    print(f"\n{'model':18s} {'eager ms':>9s} " + " ".join(f"{r + ' ms':>15s}" for r in etmlx.RUNTIMES)
          + "  largest difference (of the output's scale)")
    for row in rows:
        cells = " ".join(f"{row[r] * 1e3:8.1f} ({row[r] / row['eager']:4.1f}x)" for r in etmlx.RUNTIMES)
        print(f"{row['label']:18s} {row['eager'] * 1e3:9.1f} {cells}  {row['difference']:.1e}")
    for runtime in etmlx.RUNTIMES:
        ratios = [row[runtime] / row["eager"] for row in rows]
        print(f"{runtime}: median {statistics.median(ratios):.1f}x eager, largest {max(ratios):.1f}x")


def print_breakdown(row: dict) -> None:
    seconds = node_seconds(row["path"], list(row["inputs"]))
    total = sum(seconds.values())
    print(f"\n{row['label']}: {row['python'] / row['eager']:.1f}x eager; node by node (uncompiled) {total * 1e3:.1f} ms")
    for operation, spent in seconds.most_common(SHOWN_OPERATIONS):
        print(f"  {operation:22s} {spent * 1e3:8.1f} ms  {spent / total:5.1%}")


def _mx_ms(fn, *arrays) -> float:
    compiled = mx.compile(fn)
    return median_seconds(lambda: mx.eval(compiled(*arrays)), repeat=20) * 1e3


def _torch_ms(fn, *tensors) -> float:
    with torch.no_grad():
        return median_seconds(lambda: fn(*tensors), repeat=20) * 1e3


def micro_benchmarks() -> None:
    """MLX's CPU kernel, etmlx's own form where it runs one, PyTorch's: each compiled
    alone on a shape from the models above."""
    def normal(*shape):
        array = mx.random.normal(shape)
        mx.eval(array)
        return array, torch.from_numpy(__import__("numpy").array(array))

    def channels_first(tensor):
        return tensor.permute(0, 3, 1, 2).contiguous()

    act, act_t = normal(197, 3072)
    activations, activations_t = normal(1, 112, 112, 96)
    scores, scores_t = normal(12, 197, 197)
    rows, rows_t = normal(197, 768)
    weight, weight_t = normal(768, 3072)
    image, image_t = normal(1, 56, 56, 96)
    depthwise, depthwise_t = normal(96, 7, 7, 1)
    grouped_in, grouped_in_t = normal(1, 28, 28, 104)
    grouped, grouped_t = normal(104, 3, 3, 8)
    dense_in, dense_in_t = normal(1, 56, 56, 64)
    dense, dense_t = normal(64, 3, 3, 64)
    cases = [
        ("erf 197x3072", (mx.erf, act), (cpu_math.rational_erf, act), (torch.erf, act_t)),
        ("exp 197x3072", (mx.exp, act), (cpu_math.exp, act), (torch.exp, act_t)),
        ("sigmoid 197x3072", (mx.sigmoid, act), (cpu_math.sigmoid, act), (torch.sigmoid, act_t)),
        ("silu 112x112x96", (nn.silu, activations), (cpu_math.silu, activations), (F.silu, activations_t)),
        ("tanh 197x3072", (mx.tanh, act), None, (torch.tanh, act_t)),
        ("softmax 12x197x197", (lambda s: mx.softmax(s, axis=-1), scores), (lambda s: cpu_math.softmax(s, -1), scores),
         (lambda s: torch.softmax(s, -1), scores_t)),
        ("layer norm 197x768", (lambda r: mx.fast.layer_norm(r, None, None, 1e-6), rows), None,
         (lambda r: F.layer_norm(r, (768,)), rows_t)),
        ("matmul 197x768x3072", (mx.matmul, rows, weight), None, (torch.matmul, rows_t, weight_t)),
        ("conv 3x3 56x56x64", (lambda x, w: mx.conv2d(x, w, padding=1), dense_in, dense), None,
         (lambda x, w: F.conv2d(x, w, padding=1), channels_first(dense_in_t), channels_first(dense_t))),
        ("depthwise 7x7 56x56x96", (lambda x, w: mx.conv2d(x, w, padding=3, groups=96), image, depthwise),
         (lambda x, w: convolution._depthwise_taps(x, w, [1, 1], [3, 3], [1, 1]), image, depthwise),
         (lambda x, w: F.conv2d(x, w, padding=3, groups=96), channels_first(image_t), channels_first(depthwise_t))),
        ("grouped 3x3/13 28x28x104", (lambda x, w: mx.conv2d(x, w, padding=1, groups=13), grouped_in, grouped),
         (lambda x, w: convolution._grouped_matmul(x, w, 13, [1, 1], [1, 1], [1, 1]), grouped_in, grouped),
         (lambda x, w: F.conv2d(x, w, padding=1, groups=13), channels_first(grouped_in_t), channels_first(grouped_t))),
    ]
    print(f"\n{'kernel':24s} {'MLX ms':>8s} {'etmlx ms':>9s} {'torch ms':>9s}  MLX / torch")
    for label, mlx_case, etmlx_case, torch_case in cases:
        mlx_ms, torch_ms = _mx_ms(*mlx_case), _torch_ms(*torch_case)
        own = f"{_mx_ms(*etmlx_case):9.2f}" if etmlx_case else f"{'-':>9s}"
        print(f"{label:24s} {mlx_ms:8.2f} {own} {torch_ms:9.2f}  {mlx_ms / torch_ms:6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=list(transformers_vision.NAMED),
                        choices=list(transformers_vision.NAMED), metavar="MODEL")
    parser.add_argument("--calls", type=int, default=20,
                        help="timed calls per model and runtime (the median), in rounds of 5 taking turns")
    parser.add_argument("--breakdowns", type=int, default=3, help="how many of the slowest models to break down")
    args = parser.parse_args()
    print(f"MLX CPU; BLAS: {preload_openblas()}; torch threads: {torch.get_num_threads()}; random weights, batch 1")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [time_model(label, args.calls, tmp) for label in args.models]
        print_models(rows)
        slowest = sorted(rows, key=lambda row: row["python"] / row["eager"], reverse=True)[: args.breakdowns]
        for row in slowest:
            print_breakdown(row)
    micro_benchmarks()


if __name__ == "__main__":
    main()
