"""Speculative decoding's decode tokens/s against plain decoding, etmlx and mlx-lm
(``stream_generate(draft_model=...)``, what ``mlx_lm.generate --draft-model`` runs) on
the same pair of checkpoint folders, with acceptance rates, in one run.

    python bench/bench_speculative.py [--hidden 1024 --layers 8 --draft-layers 2 --k 4 --new-tokens 128]

Random weights agree with nothing, so the draft agrees with the target by construction:
the target is a Llama whose layers past ``--draft-layers`` add nothing to the residual
stream (their output projections are zero: they still cost what they cost), and the draft
is its first ``--draft-layers`` layers with the same embeddings, norm and head, so both
compute the same logits and every draft token is kept. ``--noise`` draws the draft's
head again with that much Gaussian noise added, so fewer are: the rate is measured and
printed. The one-file form (``export-llm --draft-layers``: the target's own first layers
and head, written into its file) is measured once, at the first noise level. Greedy;
float32; etmlx on its Python runtime (``--runtime`` to change).

Each tool's rates are the best of ``--repeats`` rounds of plain then speculative decoding
over the same loaded models, so a one-time cost (a graph compiled for a new call size) and
this shared machine's swings between two runs do not make the ratio.
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def write_pair(directory: str, hidden: int, layers: int, draft_layers: int, noise: float, context: int) -> tuple:
    """(target folder, draft folder): checkpoints with the tiny tokenizer, float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from examples import llm

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256),
                         max_position_embeddings=context)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in target.parameters():
            parameter.mul_(4.0)  # as examples/llm.tiny_checkpoint: greedy text varies
        for layer in target.model.layers[draft_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    draft = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": draft_layers})).eval()
    draft.load_state_dict(target.state_dict(), strict=False)
    with torch.no_grad():
        draft.lm_head.weight.add_(noise * torch.randn_like(draft.lm_head.weight) * draft.lm_head.weight.std())
    tokenizer = llm.train_tokenizer(128)
    tokenizer.chat_template = llm.CHAT_TEMPLATE
    folders = []
    for name, model in (("target", target), ("draft", draft)):
        folder = os.path.join(directory, name)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return tuple(folders)


def etmlx_rates(target_pte: str, draft_pte, prompt: list, new_tokens: int, k: int, runtime: str,
                repeats: int) -> dict:
    """Plain and speculative decode rates, each the best of ``repeats`` rounds; ``draft_pte``
    None: the draft written into the target's file (``export-llm --draft-layers``), over the
    same loaded program."""
    import etmlx
    from etmlx.llm import generation, speculative
    from etmlx.llm.draft import PREFIX

    target_program = etmlx.load(target_pte, runtime=runtime)
    draft_program = target_program if draft_pte is None else etmlx.load(draft_pte, runtime=runtime)
    rates = {"plain": 0.0, "speculative": 0.0}
    for _ in range(repeats):
        plain = generation.Stats()
        plain_tokens = list(generation.generate_tokens(generation.Session(target_program), prompt, new_tokens,
                                                       stats=plain, stop_at_eos=False))
        drafted = generation.Stats()
        draft = generation.Session(draft_program, prefix=PREFIX if draft_pte is None else "")
        steps = speculative.speculative_decode(generation.Session(target_program), draft, prompt, new_tokens, k=k,
                                               stats=drafted, stop_at_eos=False)
        assert [s.token for s in steps] == plain_tokens, "speculative greedy tokens differ from plain greedy ones"
        rates["plain"] = max(rates["plain"], plain.decode_tokens_per_s)
        rates["speculative"] = max(rates["speculative"], drafted.decode_tokens_per_s)
    return {**rates, "accepted": drafted.draft_accepted / drafted.draft_proposed}


def mlx_lm_rates(target_dir: str, draft_dir: str, prompt: list, new_tokens: int, k: int, repeats: int) -> dict:
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    model, tokenizer = load(target_dir)
    draft, _ = load(draft_dir)

    def rate(**options):
        last, kept = None, 0
        for response in stream_generate(model, tokenizer, prompt, max_tokens=new_tokens, **options):
            last, kept = response, kept + bool(getattr(response, "from_draft", False))
        return last.generation_tps, kept

    plain = speculative = 0.0
    for _ in range(repeats):
        plain = max(plain, rate()[0])
        drafted, kept = rate(draft_model=draft, num_draft_tokens=k)
        speculative = max(speculative, drafted)
    return {"plain": plain, "speculative": speculative, "accepted from draft": kept / new_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--runtime", choices=("python", "executorch"), default="python")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from etmlx.cli import main as etmlx
    from etmlx.runtime_shim.blas import preload_openblas

    context = 512
    print(f"target: Llama hidden {args.hidden}, {args.layers} layers (past {args.draft_layers} adding nothing); "
          f"draft: its first {args.draft_layers}; k={args.k}, {args.new_tokens} new tokens, greedy, float32; "
          f"{os.cpu_count()} cores; BLAS: {preload_openblas()}")
    print("| draft head noise | tool | plain decode tokens/s | speculative | speedup | draft tokens kept |")
    print("|---|---|---|---|---|---|")
    for noise in args.noise:
        with tempfile.TemporaryDirectory() as work:
            target_dir, draft_dir = write_pair(work, args.hidden, args.layers, args.draft_layers, noise, context)
            ptes = [os.path.join(work, "out", name, "model.pte") for name in ("target", "draft")]
            # the target with a draft of its own first layers in the file (and so verify)
            for folder, pte, options in ((target_dir, ptes[0], ["--draft-layers", str(args.draft_layers)]),
                                         (draft_dir, ptes[1], [])):
                assert etmlx(["export-llm", folder, "-o", pte, "--max-context", str(context), "--max-seq-len", "16",
                              *options]) == 0
            from etmlx.llm.generation import load_tokenizer

            prompt = load_tokenizer(target_dir).encode("hello world, the quick brown fox")
            rows = {f"etmlx ({args.runtime})": etmlx_rates(*ptes, prompt, args.new_tokens, args.k, args.runtime,
                                                           args.repeats),
                    "mlx-lm": mlx_lm_rates(target_dir, draft_dir, prompt, args.new_tokens, args.k, args.repeats)}
            if noise == args.noise[0]:  # the target's own first layers: its head has no noise
                rows[f"etmlx ({args.runtime}), one file: --draft-layers {args.draft_layers}"] = etmlx_rates(
                    ptes[0], None, prompt, args.new_tokens, args.k, args.runtime, args.repeats)
            for tool, row in rows.items():
                kept = row.get("accepted", row.get("accepted from draft"))
                label = "of proposed" if "accepted" in row else "of all tokens"
                print(f"| {noise} | {tool} | {row['plain']:.1f} | {row['speculative']:.1f} | "
                      f"{row['speculative'] / row['plain']:.2f}x | {kept:.0%} {label} |", flush=True)


if __name__ == "__main__":
    main()
