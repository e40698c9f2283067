"""Tiny Llama generation six ways, in one run: the .pte through etmlx's Python runtime
and through ExecuTorch's C++ runtime with the native backend (``forward(tokens,
cache_position)``, KV cache inside the MLX delegate, attention over its filled part:
``etmlx.llm.causal_lm``), the same file driven by ExecuTorch's own LLM runner
(``TextLLMRunner``, its timings), the Python runtime on the whole-cache form transformers'
export wrapper writes, eager PyTorch (transformers' static cache), and mlx-lm's llama built
from its ModelArgs with the same weights. fp32 activations. Then the resident memory of a
loaded program against the size of its weights, per runtime.

``--quantize int4|int8`` quantizes the weights (linear layers and embeddings, groups of
``--group-size``): torchao's weight-only quantization for the .pte and eager PyTorch,
mlx-lm's own (``nn.quantize``, same bits and group size) of the same float weights for
mlx-lm; ``mxfp8``/``nvfp4``: ExecuTorch's exportable configs, and MLX's own mode of that
name for mlx-lm. ``--max-cache`` sizes the KV cache (default: the prompt and new tokens, plus 8).
``--kv-bits 8|4`` quantizes the KV cache (``etmlx.llm.quantized_cache``, groups of
``--kv-group-size``), mlx-lm's ``QuantizedKVCache`` of the same bits and group size
from the first token; the float cache is then the eager reference the quantized
runs are measured against. ``--gguf FILE`` takes a Llama GGUF file instead (``etmlx.llm.gguf_model``: its quantized
blocks kept), mlx-lm getting its dequantized weights quantized by its own means at the
file's most common width in groups of 32 (``python -m examples.llm_gguf`` writes one).

    python bench/bench_llm.py [--hidden 64 --layers 2 --prompt 16 --new-tokens 32]
                              [--max-cache 2048] [--quantize int4 --group-size 64 | --gguf FILE]
    python bench/bench_llm.py --max-cache 32768 --held 4096 --prompt 256   # decode over 4096 held tokens
    python bench/bench_llm.py --hidden 1024 --layers 8 --max-cache 2048 --kv-bits 8
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import mlx.core as mx  # noqa: E402
import torch  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402

import llm  # noqa: E402
from etmlx.llm import gguf_model  # noqa: E402
from etmlx.inspection import inspect_program  # noqa: E402
from etmlx.quant.weights import CHOICES, FLOAT_SCHEMES, MIXED, quantized_copy  # noqa: E402


def mlx_lm_llama(model, quantize=None, group_size=64):
    """mlx-lm's llama with the Hugging Face model's weights copied in (dequantized where
    they are quantized), quantized by mlx-lm's own means when ``quantize`` is given."""
    import mlx.nn as nn
    from mlx_lm.models import llama

    c = model.config
    args = llama.ModelArgs(
        model_type="llama", hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
        rms_norm_eps=c.rms_norm_eps, vocab_size=c.vocab_size, num_key_value_heads=c.num_key_value_heads,
        rope_theta=c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta,
        tie_word_embeddings=False, max_position_embeddings=c.max_position_embeddings,
    )
    reference = llama.Model(args)
    weights = {k: v.dequantize() if hasattr(v, "dequantize") else v for k, v in model.state_dict().items()}
    reference.load_weights([(k, mx.array(v.detach().float().numpy())) for k, v in weights.items()])
    if quantize in MIXED:  # mlx-lm's own recipe of that name
        from mlx_lm.convert import mixed_quant_predicate_builder

        recipe = mixed_quant_predicate_builder(quantize, reference, group_size)
        nn.quantize(reference, group_size=group_size,
                    class_predicate=lambda path, m: hasattr(m, "to_quantized") and recipe(path, m))
    elif quantize in FLOAT_SCHEMES:  # MLX's float mode of that name, at its own group size
        nn.quantize(reference, group_size=FLOAT_SCHEMES[quantize], bits=8 if quantize == "mxfp8" else 4, mode=quantize)
    elif quantize:
        nn.quantize(reference, group_size=group_size, bits=int(quantize[3:]))
    mx.eval(reference.parameters())
    return reference


def closeness(float_model, quantized, tokens) -> tuple:
    """(mean cosine of the two models' logits, share of positions whose greedy choice they
    agree on) over ``tokens``, in eager PyTorch (the .pte computes ``quantized``'s: checked
    in the same run)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        a, b = float_model(ids).logits[0].double(), quantized(ids).logits[0].double()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1).mean()
    return float(cosine), float((a.argmax(-1) == b.argmax(-1)).double().mean())


KV_CLOSENESS_POSITIONS = 256  # eager PyTorch steps one position a call: the start of a long conversation


def kv_closeness(model, tokens, cache) -> tuple:
    """(largest logit error of the quantized cache over the float cache's largest logit,
    share of positions whose greedy choice they agree on) at each position of ``tokens``."""
    float_logits = llm.stepwise_logits(model, tokens)
    quantized = llm.stepwise_logits(model, tokens, **cache)
    error = (quantized - float_logits).abs().max() / float_logits.abs().max()
    return float(error), float((quantized.argmax(-1) == float_logits.argmax(-1)).double().mean())


def stored_bytes(path: str) -> tuple:
    """(weights, KV cache at its capacity) bytes of the .pte's delegates: their constants,
    packed when quantized, once each; and their buffers, per method (methods share them
    by name). A cache that grows is neither stored nor held at load."""
    report = inspect_program(path)
    sizes, delegates = report["named_data"], [m["delegates"] for m in report["methods"].values()]
    weights = {c["key"] for method in delegates for d in method for c in d.get("constants", [])}
    cache = max(sum(b["bytes"] for d in method for b in d.get("buffers", [])) for method in delegates)
    return sum(sizes[key] for key in weights), cache


def generation_run(prefill, decode, prompt, new_tokens):
    """(prefill seconds, decode seconds per token, tokens) of one greedy run."""
    start = time.perf_counter()
    token = prefill(prompt)
    prefilled = time.perf_counter()
    tokens = [token]
    for position in range(len(prompt), len(prompt) + new_tokens - 1):
        tokens.append(decode(tokens[-1], position))
    done = time.perf_counter()
    return prefilled - start, (done - prefilled) / max(1, new_tokens - 1), tokens


def interleaved_generation(runners: dict, prompt, new_tokens, rounds: int = 3) -> dict:
    """``{name: (prefill seconds, decode seconds per token, tokens)}`` of ``runners``
    (``{name: (prefill, decode)}``), each the least of ``rounds`` runs taken in turns (one
    run of every runner, then the next round): a machine whose speed drifts over minutes
    slows every runner alike instead of the ones that ran last."""
    best = {}
    for _ in range(rounds):
        for name, (prefill, decode) in runners.items():
            seconds_prefill, seconds_decode, tokens = generation_run(prefill, decode, prompt, new_tokens)
            earlier = best.get(name, (seconds_prefill, seconds_decode, tokens))
            best[name] = (min(earlier[0], seconds_prefill), min(earlier[1], seconds_decode), tokens)
    return best


def time_generation(prefill, decode, prompt, new_tokens):
    """(prefill seconds, decode seconds per token, tokens): the least of three runs."""
    return interleaved_generation({"runner": (prefill, decode)}, prompt, new_tokens)["runner"]


def etmlx_runner(path, runtime="python", chunk=2**31):
    """mx in and out for the Python runtime (its fastest path), torch for ExecuTorch's."""
    program = etmlx.load(path, runtime=runtime)
    if runtime == "python":
        array, arange = (lambda v: mx.array(v, dtype=mx.int64)), (lambda n: mx.arange(n, dtype=mx.int64))
    else:
        array, arange = torch.tensor, torch.arange

    def next_token(logits):  # the last position's: [1, vocab] here, [1, n, vocab] from the whole-cache form
        return int((logits[0] if logits.ndim == 2 else logits[0, -1]).argmax())

    def prefill(prompt):
        for start, part in chunks(prompt, chunk):
            logits = program.forward(array([part]), arange(len(part)) + start)
        return next_token(logits)

    def decode(token, position):
        return next_token(program.forward(array([[token]]), array([position])))

    return prefill, decode


def chunks(prompt: list, size: int):
    """(start, tokens) of ``prompt`` in calls of at most ``size`` tokens."""
    return [(start, prompt[start:start + size]) for start in range(0, len(prompt), size)]


def text_llm_runner(path, tokenizer_path, prompt_text: str, new_tokens: int):
    """ExecuTorch's LLM runner on the same file, greedy: (prefill seconds, decode seconds
    per token, the text) from its own clock (milliseconds), the best of three."""
    import etmlx.native  # noqa: F401  (registers the backend)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    runner = TextLLMRunner(path, tokenizer_path)
    config = GenerationConfig()
    config.max_new_tokens, config.temperature, config.echo = new_tokens, 0.0, False
    best = None
    for _ in range(3):
        pieces, stats = [], []
        runner.reset()  # a new conversation: the runner keeps its position across calls
        with _stdout_silenced():  # the runner prints the text and its statistics itself
            runner.generate(prompt_text, config, token_callback=pieces.append, stats_callback=stats.append)
        s = stats[-1]
        prefill = (s.prompt_eval_end_ms - s.inference_start_ms) / 1e3
        decode = (s.inference_end_ms - s.prompt_eval_end_ms) / 1e3 / max(1, s.num_generated_tokens - 1)
        run = (max(prefill, 1e-3), max(decode, 1e-6), "".join(pieces))
        best = run if best is None or run[0] + run[1] < best[0] + best[1] else best
    return best


class _stdout_silenced:
    def __enter__(self):
        sys.stdout.flush()
        self.saved = os.dup(1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)

    def __exit__(self, *exc):
        os.dup2(self.saved, 1)
        os.close(self.saved)


def eager_runner(model, chunk=2**31):
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    wrapper = TorchExportableModuleForDecoderOnlyLM(model).model  # the static-cache module export traces

    @torch.no_grad()
    def prefill(prompt):
        for start, part in chunks(prompt, chunk):
            logits = wrapper(input_ids=torch.tensor([part]), cache_position=torch.arange(len(part)) + start)
        return int(logits[0, -1].argmax())

    @torch.no_grad()
    def decode(token, position):
        return int(wrapper(input_ids=torch.tensor([[token]]), cache_position=torch.tensor([position]))[0, -1].argmax())

    return prefill, decode


def mlx_lm_runner(reference, chunk=2**31, kv_bits=None, kv_group_size=64):
    """Greedy calls of an mlx-lm model (built with the weights being compared), over its
    quantized KV cache from the first token when ``kv_bits`` is given."""
    from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

    state = {}

    def prefill(prompt):
        state["cache"] = make_prompt_cache(reference) if kv_bits is None else [
            QuantizedKVCache(group_size=kv_group_size, bits=kv_bits) for _ in reference.layers]
        for _, part in chunks(prompt, chunk):
            logits = reference(mx.array([part]), cache=state["cache"])
        return int(logits[0, -1].argmax())

    def decode(token, position):
        return int(reference(mx.array([[token]]), cache=state["cache"])[0, -1].argmax())

    return prefill, decode


def resident_memory(path: str, runtime: str) -> str:
    """RSS growth from etmlx.load and a first call, measured in a fresh process (with
    the runtime's own imports done before the baseline)."""
    code = f"""
import etmlx, numpy as np
{"import etmlx.native, torch; from executorch.runtime import Runtime; Runtime.get()" if runtime == "executorch" else ""}
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) * 1024
base = rss(); program = etmlx.load({path!r}, runtime={runtime!r}); loaded = rss()
program.forward(np.array([[1]], dtype=np.int64), np.array([0], dtype=np.int64)); called = rss()
print(loaded - base, called - base)
"""
    if not os.path.exists("/proc/self/status"):
        return "n/a (needs /proc)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return f"load +{int(out[0]) / 2**20:.1f} MiB, after first call +{int(out[1]) / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-cache", type=int, help="KV cache capacity (default: prompt + new tokens + 8)")
    parser.add_argument("--quantize", choices=CHOICES)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--gguf", help="a Llama GGUF file instead of a random model")
    parser.add_argument("--kv-bits", type=int, choices=(4, 8), help="a quantized KV cache")
    parser.add_argument("--kv-group-size", type=int, default=64)
    parser.add_argument("--held", type=int, help="a prompt of this many tokens, prefilled in calls of --prompt "
                        "tokens (every runner alike), so that decode reads a cache holding them")
    args = parser.parse_args()
    held = args.held or args.prompt
    max_cache = args.max_cache or held + args.new_tokens + 8
    args.group_size = FLOAT_SCHEMES.get(args.quantize, args.group_size)  # a float mode's own
    if args.gguf:
        loaded = gguf_model.load(args.gguf, torch.float32)
        model = exported = llm.with_static_cache(loaded.model, max_cache)
        widths = Counter(f"int{gguf_model.BITS[f.split()[0]]}" for f in loaded.formats.values())
        args.quantize, args.group_size = widths.most_common(1)[0][0], 32  # mlx-lm's, of the float weights
        args.hidden, args.layers = model.config.hidden_size, model.config.num_hidden_layers
        weights_are = f"the GGUF file's ({', '.join(f'{n} {f}' for f, n in Counter(loaded.formats.values()).items())}" \
                      f"{f'; {len(loaded.declined)} left float' if loaded.declined else ''})"
    else:
        model = llm.tiny_llama(hidden=args.hidden, layers=args.layers, max_cache=max_cache)
        exported = model
        weights_are = args.quantize or "fp32"
        if args.quantize:
            exported, _ = quantized_copy(model, args.quantize, args.group_size)
            weights_are += f" (groups of {args.group_size})"
    prompt = list(range(3, 3 + args.prompt))
    with tempfile.TemporaryDirectory() as tmp:
        path, whole_cache = os.path.join(tmp, "llm.pte"), os.path.join(tmp, "whole_cache.pte")
        kv_cache = dict(kv_bits=args.kv_bits, kv_group_size=args.kv_group_size)
        result = etmlx.export_methods(llm.export_methods(exported, args.prompt, **kv_cache), path)
        etmlx.export_methods(llm.export_whole_cache_methods(exported, args.prompt), whole_cache)
        tokenizer = loaded.tokenizer if args.gguf else llm.train_tokenizer(model.config.vocab_size)
        tokenizer_path = os.path.join(tmp, "tokenizer.json")
        tokenizer.backend_tokenizer.save(tokenizer_path)
        corpus = tokenizer.encode(" ".join(llm.CORPUS), add_special_tokens=False)
        prompt = (corpus * (held // len(corpus) + 1))[:held]
        chunk = args.prompt
        runs = {
            "etmlx python": time_generation(*etmlx_runner(path, chunk=chunk), prompt, args.new_tokens),
            "etmlx native": time_generation(*etmlx_runner(path, "executorch", chunk), prompt, args.new_tokens),
            "  whole cache": time_generation(*etmlx_runner(whole_cache, chunk=chunk), prompt, args.new_tokens),
            "eager PyTorch": time_generation(*eager_runner(exported, chunk), prompt, args.new_tokens),
            "mlx-lm llama": time_generation(*mlx_lm_runner(mlx_lm_llama(model, args.quantize, args.group_size), chunk,
                                                           **kv_cache), prompt, args.new_tokens),
        }
        runner = text_llm_runner(path, tokenizer_path, tokenizer.decode(prompt), args.new_tokens)
        weights, cache = stored_bytes(path)
        memory = {runtime: resident_memory(path, runtime) for runtime in etmlx.RUNTIMES}
    print(f"Llama hidden {args.hidden}, {args.layers} layers, prompt {held} (calls of {chunk}), "
          f"{args.new_tokens} new tokens, "
          f"max cache {max_cache}{f' quantized to {args.kv_bits} bits (groups of {args.kv_group_size})' if args.kv_bits else ''}, "
          f"fp32 activations, weights {weights_are}; BLAS: {preload_openblas()}; "
          f"{result.report.summary()}")
    # a quantized cache computes other logits than eager's float one: compared below instead
    compared = ("etmlx python", "etmlx native") if args.kv_bits else ("etmlx python", "etmlx native", "  whole cache",
                                                                      "eager PyTorch")
    same = len({tuple(runs[name][2]) for name in compared}) == 1
    print("etmlx: attention over the filled cache (etmlx.llm.causal_lm); '  whole cache': the Python runtime "
          "attending over the whole cache (transformers' export wrapper)")
    reference = runs[compared[-1]][2]
    runner_same = runner[2] == tokenizer.decode(reference)
    print(f"greedy tokens of the .pte identical {'on both runtimes' if args.kv_bits else 'to eager PyTorch (both runtimes, both forms)'}: "
          f"{same}; ExecuTorch's TextLLMRunner's text {'equal too' if runner_same else 'differs'}; mlx-lm's "
          f"{'equal too' if runs['mlx-lm llama'][2] == reference else 'differ'}"
          f"{f' (its own quantization, {args.quantize} in groups of {args.group_size})' if args.quantize else ''}")
    if args.kv_bits:
        conversation = (prompt + runs["etmlx python"][2])[:KV_CLOSENESS_POSITIONS]
        error, agreement = kv_closeness(exported, conversation, kv_cache)
        print(f"the quantized cache against the float one (eager PyTorch, one call a position over the first "
              f"{len(conversation)} positions of prompt and reply): largest logit error {error:.2%} of the largest "
              f"logit, greedy choice agreeing at {agreement:.0%} of positions")
    if args.quantize and not args.gguf:
        cosine, agreement = closeness(model, exported, runs["eager PyTorch"][2])
        print(f"against the float model, over those tokens: logits' cosine {cosine:.4f} (mean over positions), "
              f"greedy choice agreeing at {agreement:.0%} of positions")
    base_prefill, base_decode, _ = runs["mlx-lm llama"]
    print(f"{'':<16}{'prefill tok/s':>15}{'decode tok/s':>14}{'prefill vs mlx-lm':>19}{'decode vs mlx-lm':>18}")
    for name, (prefill, decode, _) in [*runs.items(), ("TextLLMRunner", runner)]:
        print(f"{name:<16}{held / prefill:>15.0f}{1 / decode:>14.0f}"
              f"{base_prefill / prefill:>18.2f}x{base_decode / decode:>17.2f}x")
    print(f"TextLLMRunner decode vs etmlx native: {runs['etmlx native'][1] / runner[1]:.2f}x (its clock counts milliseconds)")
    print(f"weights as stored {weights / 2**20:.2f} MiB, KV cache {cache / 2**20:.2f} MiB at capacity (held as "
          f"tokens are), .pte {result.size_bytes / 2**20:.2f} MiB ({result.size_bytes / weights:.2f}x weights); "
          f"resident memory (weights + cache = {(weights + cache) / 2**20:.1f} MiB):")
    for runtime, text in memory.items():
        print(f"  {runtime:<12} {text}")


if __name__ == "__main__":
    main()
