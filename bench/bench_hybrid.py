"""Hybrid language models (recurrent layers beside attention: ``etmlx.llm.recurrent_state``)
against mlx-lm's implementation of the same checkpoint, in one run: greedy prefill and decode
of the ``.pte`` on etmlx's Python runtime and on ExecuTorch's C++ runtime with the native
backend, and of mlx-lm's model loaded from the same checkpoint folder (``mlx_lm.utils.load_model``),
float32 weights, on this machine's MLX device. The tokens of every runner are compared with
mlx-lm's and with eager transformers' greedy ``generate`` on the same checkpoint. The
runners take turns, ``--rounds`` runs each, and each reports its least prefill and decode
times, so the machine's drift over minutes does not favour one runner.

    python bench/bench_hybrid.py [--family qwen3_5|lfm2|mamba2|mamba] [--hidden 1024 --layers 8]
                                 [--max-cache 2048 --prompt 128 --new-tokens 64 --rounds 3]
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import mlx.core as mx  # noqa: E402
import torch  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402

from bench_llm import etmlx_runner, interleaved_generation, mlx_lm_runner  # noqa: E402


def hybrid_config(family: str, hidden: int, layers: int, max_cache: int):
    """A config of ``family`` shaped like its small releases (Qwen3.5-0.8B's heads and
    one attention layer in four; LFM2's convolutions with attention every third layer;
    Mamba2's heads of 64 and states of 128; Mamba's states of 16), at ``hidden`` and
    ``layers``, with a vocabulary of 32768."""
    import transformers

    common = dict(vocab_size=32768, hidden_size=hidden, num_hidden_layers=layers, max_position_embeddings=max_cache,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)  # as the small releases
    if family == "qwen3_5":
        kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        return transformers.Qwen3_5TextConfig(
            **common, intermediate_size=3 * hidden, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
            linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
            layer_types=kinds)
    if family == "mamba2":  # mamba2-370m's heads and state at this width
        return transformers.Mamba2Config(**common, num_heads=hidden * 2 // 64, head_dim=64, n_groups=1,
                                         state_size=128, expand=2)
    if family == "mamba":  # mamba-370m's state and time-step rank at this width
        return transformers.MambaConfig(**common, state_size=16, expand=2, conv_kernel=4)
    kinds = ["full_attention" if i % 3 == 2 else "conv" for i in range(layers)]
    return transformers.Lfm2Config(**common, intermediate_size=4 * hidden, num_attention_heads=16, num_key_value_heads=8,
                                   layer_types=kinds)


def write_checkpoint(family: str, hidden: int, layers: int, max_cache: int, directory: str) -> str:
    """A checkpoint folder of random float32 weights (large enough that greedy text varies)."""
    import transformers

    config = hybrid_config(family, hidden, layers, max_cache)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(2.0)
    model.save_pretrained(directory)
    return directory


def mlx_lm_model(checkpoint: str, family: str, hidden: int):
    """mlx-lm's model of ``family`` from the checkpoint folder, given the keys its config
    reads that transformers 5 no longer writes (LFM2's ``block_dim``, the hidden size;
    Mamba2's and Mamba's ``intermediate_size``)."""
    from mlx_lm.utils import load_model

    renamed = {"lfm2": {"block_dim": hidden}, "mamba2": {"intermediate_size": 2 * hidden},
               "mamba": {"intermediate_size": 2 * hidden}}
    config = {"model_type": family, **renamed.get(family, {})}
    model, _ = load_model(Path(checkpoint), model_config=config)
    mx.eval(model.parameters())
    return model


def eager_tokens(checkpoint: str, prompt: list, new_tokens: int) -> list:
    """transformers' greedy tokens after ``prompt``, from the checkpoint folder (no EOS stop)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                   eos_token_id=None)
    return generated[0, len(prompt):].tolist()


def first_difference(tokens: list, reference: list) -> str:
    return "same" if tokens == reference else \
        f"differ at {next(i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=("qwen3_5", "lfm2", "mamba2", "mamba"), default="qwen3_5")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--max-cache", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    blas = "OpenBLAS" if preload_openblas() else "MLX's bundled BLAS"
    print(f"{args.family}: hidden {args.hidden}, {args.layers} layers, cache {args.max_cache}, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, float32; MLX {mx.__version__} on {mx.default_device()}, {blas}")
    prompt = [int(t) for t in torch.randint(3, 32768, (args.prompt,), generator=torch.Generator().manual_seed(1))]
    with tempfile.TemporaryDirectory() as work:
        checkpoint = write_checkpoint(args.family, args.hidden, args.layers, args.max_cache, os.path.join(work, "ckpt"))
        path = os.path.join(work, "model.pte")
        etmlx.export_llm(checkpoint, path, max_context=args.max_cache, max_seq_len=args.prompt)
        runs = interleaved_generation({
            "mlx-lm": mlx_lm_runner(mlx_lm_model(checkpoint, args.family, args.hidden)),
            "etmlx python": etmlx_runner(path, "python"),
            "etmlx native": etmlx_runner(path, "executorch"),
        }, prompt, args.new_tokens, args.rounds)
        eager = eager_tokens(checkpoint, prompt, args.new_tokens)
    base_prefill, base_decode, reference = runs["mlx-lm"]
    print(f"{'':<16}{'prefill tok/s':>15}{'decode tok/s':>14}{'prefill vs mlx-lm':>19}{'decode vs mlx-lm':>18}"
          "  tokens vs mlx-lm, vs eager transformers")
    for name, (prefill, decode, tokens) in runs.items():
        print(f"{name:<16}{args.prompt / prefill:>15.0f}{1 / decode:>14.1f}{base_prefill / prefill:>18.2f}x"
              f"{base_decode / decode:>17.2f}x  {first_difference(tokens, reference)}, {first_difference(tokens, eager)}")


if __name__ == "__main__":
    main()
