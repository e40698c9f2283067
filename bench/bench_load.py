"""Start-up: loading a language model's ``.pte`` on both runtimes, against reading the file.

Each figure comes from a fresh process (``--child RUNTIME PATH [--first-call]``, which
prints them as JSON; tests/loading runs it too), its baseline taken after the
runtime's own imports and MLX's start (``etmlx``, its MLX delegate; for ``executorch``
also ``etmlx.native``, ExecuTorch's runtime and torch: what a process pays once,
whatever it loads):

- load: seconds in ``etmlx.load`` (``read``: ``open(path).read()``; ``TextLLMRunner``:
  ExecuTorch's LLM runner built and
  one token generated: it loads the program then), and the first call
  (a decode step, MLX's compile included) apart;
- peak: growth of the process's peak resident memory during the load (``VmHWM``, reset
  just before it);
- after: growth of its resident memory once loaded;
- both as ratios to what a loaded program must hold, its constants plus buffers
  (``etmlx inspect``'s ``held_bytes``: the weights; a KV cache grows with the tokens
  held and holds nothing yet);
- with ``--held N``: the peak and resident growth once N tokens are prefilled after
  the load and ``DECODED`` more decoded one at a time, against the weights plus those
  tokens' cache (``held_bytes``'s ``growing_buffers`` scaled to them).

The file is read once before the runs, so every process finds it in the page cache.

    python bench/bench_load.py                      # Llama, hidden 1024, 8 layers, fp32 and int4
    python bench/bench_load.py --pte model.pte      # a program of your own (TextLLMRunner
                                                    # too, for an LLM with a tokenizer.json beside it)
    python bench/bench_load.py --max-cache 32768 --held 40   # memory that follows the tokens held
    python bench/bench_load.py --max-cache 32768 --held 4096 --kv-bits 8   # a quantized cache
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

RUNTIMES = ("read", "python", "executorch", "TextLLMRunner")
DECODED = 8  # tokens decoded after a --held prefill
MIB = 2**20


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def _reset_peak() -> None:
    """The peak (VmHWM) restarts from the resident size now (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _child(runtime: str, path: str, first_call: bool, held: int = 0) -> dict:
    """``runtime`` "TextLLMRunner": ExecuTorch's LLM runner, with the tokenizer.json
    beside ``path``. ``held``: tokens prefilled after the load (``python`` and
    ``executorch``), measured as ``held_peak`` and ``held_after``."""
    import mlx.core as mx
    import numpy as np

    import etmlx
    from etmlx.runtime_shim import mlx_delegate  # noqa: F401  (what a first load would import)

    mx.eval(mx.zeros(1))  # MLX's allocator and threads started
    if runtime in ("executorch", "TextLLMRunner"):
        import torch  # noqa: F401
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
        from executorch.runtime import Runtime

        import etmlx.native  # noqa: F401

        Runtime.get()
    _reset_peak()
    resident = _status_bytes("VmRSS")
    start = time.perf_counter()
    if runtime == "read":
        with open(path, "rb") as f:
            program = f.read()
    elif runtime == "TextLLMRunner":  # it loads the program on its first generate
        config = GenerationConfig()
        config.max_new_tokens, config.temperature, config.echo = 1, 0.0, False
        program = TextLLMRunner(path, os.path.join(os.path.dirname(path), "tokenizer.json"))
        program.generate("a", config, token_callback=lambda _: None, stats_callback=lambda _: None)
    else:
        program = etmlx.load(path, runtime=runtime)
    loaded = time.perf_counter()
    result = {"load_s": loaded - start, "peak": _status_bytes("VmHWM") - resident,
              "after": _status_bytes("VmRSS") - resident}
    if first_call and runtime in ("python", "executorch"):
        program.forward(np.array([[1]], np.int64), np.array([0], np.int64))
        result["first_call_s"] = time.perf_counter() - loaded
    if held and runtime in ("python", "executorch"):
        chunk = program.run_method("get_max_seq_len", [])[0]
        for start in range(0, held, chunk):
            positions = np.arange(start, min(start + chunk, held), dtype=np.int64)
            program.forward((positions % 97 + 1)[None], positions)
        for position in range(held, held + DECODED):
            program.forward(np.array([[position % 97 + 1]], np.int64), np.array([position], np.int64))
        result["held_peak"] = _status_bytes("VmHWM") - resident
        result["held_after"] = _status_bytes("VmRSS") - resident
    return result


def run_child(runtime: str, path: str, first_call: bool = False, held: int = 0) -> dict:
    """``_child``'s figures, from a fresh process."""
    command = [sys.executable, os.path.abspath(__file__), "--child", runtime, path] + ["--first-call"] * first_call
    command += ["--held", str(held)] if held else []
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _export(directory: str, quantize, hidden: int, layers: int, max_cache: int, kv_bits=None) -> str:
    import llm

    import etmlx

    model = llm.tiny_llama(hidden=hidden, layers=layers, max_cache=max_cache)
    if quantize:
        from etmlx.quant.weights import quantized_copy

        model, _ = quantized_copy(model, quantize, 64, True)
    path = os.path.join(directory, f"llama-{quantize or 'fp32'}.pte")
    etmlx.export_methods(llm.export_methods(model, kv_bits=kv_bits), path)
    llm.train_tokenizer(model.config.vocab_size).backend_tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return path


def report(path: str, label: str, repeats: int, held_tokens: int = 0) -> None:
    from etmlx.inspection import constant_methods, inspect_program

    held = inspect_program(path)["held_bytes"]
    language_model = "get_max_context_len" in constant_methods(path)  # forward(tokens, cache_position)
    tokenizer = os.path.exists(os.path.join(os.path.dirname(path), "tokenizer.json"))
    need = held["constants"] + held["buffers"]
    with open(path, "rb") as f:
        while f.read(MIB):  # into the page cache: every run below reads from memory
            pass
    print(f"\n{label}: {os.path.getsize(path) / MIB:.0f} MiB file; holds {held['constants'] / MIB:.0f} MiB of "
          f"constants + {held['buffers'] / MIB:.0f} MiB of buffers (= 1.00x below)")
    print(f"{'':<12}{'load s':>9}{'vs read':>9}{'peak MiB':>10}{'peak/held':>11}{'after MiB':>11}{'after/held':>12}"
          f"{'1st call s':>12}")
    fastest = lambda runtime: min(  # noqa: E731
        (run_child(runtime, path, language_model, held_tokens) for _ in range(repeats)), key=lambda r: r["load_s"]
    )
    runs = [r for r in RUNTIMES if r != "TextLLMRunner" or (language_model and tokenizer)]
    rows = {runtime: fastest(runtime) for runtime in runs}
    for runtime, row in rows.items():
        first = f"{row['first_call_s']:>12.3f}" if "first_call_s" in row else f"{'':>12}"
        print(f"{runtime:<12}{row['load_s']:>9.3f}{row['load_s'] / rows['read']['load_s']:>8.2f}x"
              f"{row['peak'] / MIB:>10.0f}{row['peak'] / need:>10.2f}x{row['after'] / MIB:>11.0f}"
              f"{row['after'] / need:>11.2f}x{first}")
    if held_tokens:
        capacity = constant_methods(path)["get_max_context_len"][0]
        cache = held["growing_buffers"] * min(held_tokens + DECODED, capacity) / capacity
        print(f"{held_tokens} tokens prefilled and {DECODED} decoded: weights + their cache = {(need + cache) / MIB:.1f} MiB (the whole "
              f"{capacity}-token cache: {held['growing_buffers'] / MIB:.0f} MiB more)")
        print(f"{'':<12}{'peak MiB':>10}{'peak/need':>11}{'after MiB':>11}{'after/need':>12}")
        for runtime, row in rows.items():
            if "held_peak" in row:
                print(f"{runtime:<12}{row['held_peak'] / MIB:>10.1f}{row['held_peak'] / (need + cache):>10.2f}x"
                      f"{row['held_after'] / MIB:>11.1f}{row['held_after'] / (need + cache):>11.2f}x")


def main() -> None:
    if not os.path.exists("/proc/self/clear_refs"):
        sys.exit("bench_load.py measures peak and resident memory through /proc (Linux 4.0 or later)")
    if sys.argv[1:2] == ["--child"]:
        held = int(sys.argv[sys.argv.index("--held") + 1]) if "--held" in sys.argv else 0
        print(json.dumps(_child(sys.argv[2], sys.argv[3], first_call="--first-call" in sys.argv, held=held)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pte", help="a .pte to load instead of the exported Llamas")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--max-cache", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3, help="processes per runtime; the fastest load is shown")
    parser.add_argument("--held", type=int, default=0, help="tokens to prefill after the load, then measure again")
    parser.add_argument("--kv-bits", type=int, choices=(4, 8), help="the exported Llamas' KV cache quantized "
                        "(groups of 64)")
    args = parser.parse_args()
    from etmlx.runtime_shim.blas import preload_openblas

    print(f"MLX CPU; BLAS: {preload_openblas()}")
    if args.pte:
        report(args.pte, args.pte, args.repeats, args.held)
        return
    with tempfile.TemporaryDirectory() as directory:
        for quantize in (None, "int4"):
            start = time.perf_counter()
            path = _export(directory, quantize, args.hidden, args.layers, args.max_cache, args.kv_bits)
            label = f"Llama hidden {args.hidden}, {args.layers} layers, cache {args.max_cache}" + (
                f" at {args.kv_bits} bits" if args.kv_bits else "") + f", {quantize or 'fp32'}"
            built = f"built and exported in {time.perf_counter() - start:.1f} s"
            report(path, f"{label} ({built})", args.repeats, args.held)


if __name__ == "__main__":
    main()
