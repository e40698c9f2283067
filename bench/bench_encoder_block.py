"""The example encoder block three ways, in one run: eager PyTorch, the .pte through
etmlx.load, and the same block written directly in MLX with the same weights.

    make bench          (or: python bench/bench_encoder_block.py --batch 2 --seq 128)
"""

import argparse
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import torch  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402

from examples.models import EncoderBlock  # noqa: E402
from etmlx.timing import median_seconds  # noqa: E402
from timing import print_table  # noqa: E402


def mlx_encoder_block(block: EncoderBlock):
    """The block by hand in MLX: the reference a user would write without etmlx."""
    w = {k: mx.array(v.detach().numpy()) for k, v in block.state_dict().items()}
    heads, dim = block.heads, block.embed.embedding_dim
    head_dim = dim // heads

    def linear(x, name):
        return mx.addmm(w[f"{name}.bias"], x, w[f"{name}.weight"].T)

    def forward(tokens):
        x = w["embed.weight"][tokens]
        batch, seq, _ = x.shape
        h = mx.fast.layer_norm(x, w["norm1.weight"], w["norm1.bias"], 1e-5)
        qkv = linear(h, "qkv").reshape(batch, seq, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(head_dim)
        attn = (mx.softmax(scores, axis=-1, precise=True) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
        x = x + linear(attn, "proj")
        h = mx.fast.layer_norm(x, w["norm2.weight"], w["norm2.bias"], 1e-5)
        x = x + linear(nn.gelu(linear(h, "up")) * nn.silu(linear(h, "gate")), "down")
        return x

    return lambda tokens: mx.eval(forward(tokens))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    block = EncoderBlock().eval()
    tokens = torch.randint(0, 256, (args.batch, args.seq))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "encoder_block.pte")
        etmlx.export(block, (tokens,), path)
        program = etmlx.load(path)
    tokens_mx = mx.array(tokens.numpy())
    by_hand = mlx_encoder_block(block)
    with torch.no_grad():
        diff = (program.forward(tokens) - block(tokens)).abs().max().item()
        rows = [
            ("eager PyTorch", median_seconds(block, tokens)),
            ("etmlx .pte (torch in/out)", median_seconds(program.forward, tokens)),
            ("etmlx .pte (mx in/out)", median_seconds(program.forward, tokens_mx)),
            ("MLX by hand", median_seconds(by_hand, tokens_mx)),
        ]
    print(f"encoder block, batch {args.batch}, seq {args.seq}, fp32; BLAS: {preload_openblas()}")
    print(f"torch threads: {torch.get_num_threads()}; max |etmlx - eager| = {diff:.2e}")
    print_table(rows, baseline="MLX by hand")


if __name__ == "__main__":
    main()
