"""Rank-3 attention on MLX, fused (ExpandDims -> Sdpa -> Squeeze) against the same call
decomposed into primitives, both as .pte files run by etmlx, in one run.

    python bench/bench_attention.py [--heads 8 --seq 256 --head-dim 64]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import mlx.core as mx  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from etmlx.inspection import inspect_program  # noqa: E402
from etmlx.partitioner import MlxPartitioner  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402

from etmlx.timing import median_seconds  # noqa: E402
from timing import print_table  # noqa: E402


class Rank3Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def build(inputs, keep_fused: bool):
    program = torch.export.export(Rank3Attention(), inputs)
    pte = to_edge_transform_and_lower(program, partitioner=[MlxPartitioner(keep_fused=keep_fused)]).to_executorch()
    nodes = [n for d in inspect_program(pte.buffer)["methods"]["forward"]["delegates"] for n in d["nodes"]]
    return etmlx.load(pte.buffer), nodes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    shape = (args.heads, args.seq, args.head_dim)
    inputs = tuple(torch.randn(*shape) for _ in range(3))
    inputs_mx = tuple(mx.array(x.numpy()) for x in inputs)
    fused, fused_nodes = build(inputs, keep_fused=True)
    decomposed, decomposed_nodes = build(inputs, keep_fused=False)
    expected = Rank3Attention()(*inputs)
    for program in (fused, decomposed):
        torch.testing.assert_close(program.forward(*inputs), expected, rtol=1e-4, atol=1e-4)
    print(f"rank-3 causal attention {shape}, fp32; BLAS: {preload_openblas()}")
    print(f"fused nodes:      {' -> '.join(fused_nodes)}")
    print(f"decomposed nodes: {len(decomposed_nodes)} ({', '.join(sorted(set(decomposed_nodes)))})")
    rows = [
        ("fused (Sdpa)", median_seconds(fused.forward, *inputs_mx)),
        ("decomposed", median_seconds(decomposed.forward, *inputs_mx)),
    ]
    print_table(rows, baseline="fused (Sdpa)")


if __name__ == "__main__":
    main()
