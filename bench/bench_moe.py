"""A tiny Mixtral (mixture of experts: each token's top 2 of 8 SwiGLU experts) generating,
in one run: the .pte on etmlx's Python runtime and on ExecuTorch's C++ runtime with the
native backend (``etmlx.llm.causal_lm``: the router's top-k and the experts' ``mx.gather_mm``
inside the MLX delegate), the same export with the gather_mm fusion switched off (each
token's expert weights gathered, then matmuls: what lowering emitted before), eager
PyTorch (transformers' default ``grouped_mm`` experts, static cache) and mlx-lm's
mixtral with the same weights. fp32 activations.

``--quantize int4|int8`` quantizes the weights (linear layers, embeddings and expert
stacks, groups of ``--group-size``): ``etmlx.quant.weights`` for the .pte and eager
PyTorch, mlx-lm's own ``nn.quantize`` of the same float weights for mlx-lm.

    python bench/bench_moe.py [--hidden 256 --layers 4 --experts 8 --prompt 64 --new-tokens 32]
                              [--quantize int4 --group-size 64]
"""

import argparse
import os
import sys
import tempfile
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import mlx.core as mx  # noqa: E402

import llm  # noqa: E402
from bench_llm import eager_runner, etmlx_runner, mlx_lm_runner, time_generation  # noqa: E402
from etmlx.lowering import fusions  # noqa: E402
from etmlx.quant.weights import SCHEMES, quantized_copy  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402


def mlx_lm_mixtral(model, quantize=None, group_size=64):
    """mlx-lm's mixtral with the Hugging Face model's weights: transformers stores each
    layer's experts as one (experts, 2 * ffn, hidden) gate-and-up stack, mlx-lm as two."""
    import mlx.nn as nn
    from mlx_lm.models import mixtral

    c = model.config
    args = mixtral.ModelArgs(
        model_type="mixtral", vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_experts_per_tok=c.num_experts_per_tok,
        num_key_value_heads=c.num_key_value_heads, num_local_experts=c.num_local_experts,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_parameters["rope_theta"],
    )
    reference = mixtral.Model(args)
    weights = []
    for name, value in model.state_dict().items():
        value = mx.array(value.detach().numpy())
        name = name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.switch_mlp")
            gate, up = mx.split(value, 2, axis=1)
            weights += [(f"{prefix}.gate_proj.weight", gate), (f"{prefix}.up_proj.weight", up)]
        elif name.endswith(".mlp.experts.down_proj"):
            weights.append((name.replace(".mlp.experts.down_proj", ".block_sparse_moe.switch_mlp.down_proj.weight"), value))
        else:
            weights.append((name, value))
    reference.load_weights(weights)
    if quantize:
        nn.quantize(reference, group_size=group_size, bits=int(quantize[3:]))
    mx.eval(reference.parameters())
    return reference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--quantize", choices=SCHEMES)
    parser.add_argument("--group-size", type=int, default=64)
    args = parser.parse_args()
    capacity = args.prompt + args.new_tokens + 8
    model = llm.tiny_mixtral(hidden=args.hidden, layers=args.layers, experts=args.experts, max_cache=capacity)
    exported = quantized_copy(model, args.quantize, args.group_size)[0] if args.quantize else model
    prompt = list(range(3, 3 + args.prompt))
    with tempfile.TemporaryDirectory() as tmp:
        fused, unfused = os.path.join(tmp, "moe.pte"), os.path.join(tmp, "gathers.pte")
        result = etmlx.export_methods(llm.export_methods(exported, args.prompt), fused)
        without = tuple(f for f in fusions.LOWERING_FUSIONS if f.NAME != "batched matmul of gathered matrices -> mx.gather_mm")
        with mock.patch.object(fusions, "LOWERING_FUSIONS", without):
            etmlx.export_methods(llm.export_methods(exported, args.prompt), unfused)
        runs = {
            "etmlx python": time_generation(*etmlx_runner(fused), prompt, args.new_tokens),
            "etmlx native": time_generation(*etmlx_runner(fused, "executorch"), prompt, args.new_tokens),
            "  no gather_mm": time_generation(*etmlx_runner(unfused), prompt, args.new_tokens),
            "eager PyTorch": time_generation(*eager_runner(exported), prompt, args.new_tokens),
            "mlx-lm mixtral": time_generation(*mlx_lm_runner(mlx_lm_mixtral(model, args.quantize, args.group_size)),
                                              prompt, args.new_tokens),
        }
    print(f"Mixtral hidden {args.hidden}, {args.layers} layers, top 2 of {args.experts} experts (ffn {2 * args.hidden}), "
          f"prompt {args.prompt}, {args.new_tokens} new tokens, fp32 activations, weights {args.quantize or 'fp32'}"
          f"{f' (groups of {args.group_size})' if args.quantize else ''}; BLAS: {preload_openblas()}; "
          f"{result.report.summary()}")
    tokens = {name: tuple(run[2]) for name, run in runs.items()}
    print(f"greedy tokens equal eager PyTorch's{' (mlx-lm: its own quantization)' if args.quantize else ''}: "
          + ", ".join(f"{name.strip()} {tokens[name] == tokens['eager PyTorch']}" for name in runs if name != "eager PyTorch"))
    base_prefill, base_decode, _ = runs["mlx-lm mixtral"]
    eager_prefill, eager_decode, _ = runs["eager PyTorch"]
    print(f"{'':<16}{'prefill tok/s':>15}{'decode tok/s':>14}{'prefill vs mlx-lm':>19}{'decode vs mlx-lm':>18}"
          f"{'prefill vs eager':>18}{'decode vs eager':>17}")
    for name, (prefill, decode, _) in runs.items():
        print(f"{name:<16}{args.prompt / prefill:>15.0f}{1 / decode:>14.0f}"
              f"{base_prefill / prefill:>18.2f}x{base_decode / decode:>17.2f}x"
              f"{eager_prefill / prefill:>17.2f}x{eager_decode / decode:>16.2f}x")


if __name__ == "__main__":
    main()
