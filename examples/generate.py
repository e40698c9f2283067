"""Greedy generation on MLX with a KV cache: a tiny Hugging Face Llama (or, with
``--model mixtral``, a mixture of experts) exported to one .pte in ExecuTorch's LLM-runner
convention (``forward(tokens, cache_position)``, ``etmlx.llm.causal_lm``), compared token for
token with eager PyTorch's greedy generation of the same model. With ``--quantize int4`` (or int8) the weights of linear layers and
embeddings are quantized first (torchao, weight-only) and run on MLX's quantized
kernels; the reference is then the quantized model in eager PyTorch.

    python examples/generate.py [--model mixtral] [--new-tokens 32] [--runtime executorch] [--quantize int4]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import etmlx  # noqa: E402  (first, so mlx runs on OpenBLAS where available)
import torch  # noqa: E402

import llm  # noqa: E402
from etmlx.quant.weights import CHOICES  # noqa: E402

PROMPT = [5, 17, 42, 8, 99, 3]
MODELS = {"llama": llm.tiny_llama, "mixtral": llm.tiny_mixtral}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, default="llama")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--output", help="where to write the .pte (default out/tiny_<model>.pte)")
    parser.add_argument("--runtime", choices=etmlx.RUNTIMES, default="python",
                        help="etmlx's Python runtime, or ExecuTorch's C++ runtime with the native backend")
    parser.add_argument("--quantize", choices=CHOICES, help="quantize the weights first (torchao weight-only)")
    parser.add_argument("--group-size", type=int, default=32, help="values per quantization group (default 32)")
    args = parser.parse_args()
    args.output = args.output or os.path.join("out", f"tiny_{args.model}.pte")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)

    model = MODELS[args.model]()
    if args.quantize:
        from etmlx.quant.weights import quantized_copy

        model, layers = quantized_copy(model, args.quantize, args.group_size)
        print(f"quantized {len(layers)} layers to {args.quantize}, groups of {args.group_size}")
    result = etmlx.export_methods(llm.export_methods(model), args.output)
    print(f"wrote {result.path} ({result.size_bytes} bytes); {result.report.summary()}")

    program = etmlx.load(args.output, runtime=args.runtime)
    start = time.perf_counter()
    tokens = llm.greedy(program, PROMPT, args.new_tokens)
    seconds = time.perf_counter() - start

    with torch.no_grad():
        eager = llm.eager_greedy(model, PROMPT, args.new_tokens)
    print(f"prompt:  {PROMPT}")
    print(f"etmlx:   {tokens[len(PROMPT):]} ({args.runtime} runtime)")
    print(f"eager:   {eager[len(PROMPT):]}")
    print(f"{args.new_tokens} tokens in {seconds * 1e3:.1f} ms ({args.new_tokens / seconds:.0f} tokens/s, prefill included)")
    if tokens != eager:
        sys.exit("etmlx tokens differ from eager PyTorch")
    print("tokens equal eager PyTorch's greedy tokens")


if __name__ == "__main__":
    main()
