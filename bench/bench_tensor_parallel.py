"""Tensor parallelism on this machine: a tiny Llama exported for 1 and for 2 ranks
(``tensor_parallel=``), each run under ``mlx.launch --backend ring`` (loopback). Per
rank: resident memory grown by ``etmlx.load`` and the first call, against the bytes of
that rank's weights; decode tokens per second (greedy, after a prefill), 2 ranks vs 1.

All ranks share this machine's cores, so 2 ranks split the same CPUs (and pay the
ring's loopback sums): on separate machines each rank has its own cores and memory
bandwidth, the case tensor parallelism is for.

    python bench/bench_tensor_parallel.py [--hidden 1024 --layers 8 --prompt 16 --new-tokens 64]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import numpy as np  # noqa: E402

import etmlx  # noqa: E402


def _rss() -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) * 1024


def rank_main(directory: str, runtime: str, prompt: int, new_tokens: int) -> None:
    """One rank: load, prefill, then time ``new_tokens`` decode steps; prints one JSON line."""
    import mlx.core as mx

    mx.distributed.init()  # the ring's own buffers are not the program's
    before = _rss()
    program = etmlx.load(directory, runtime=runtime)
    tokens = list(range(1, prompt + 1))
    logits = program.run_method("forward", [np.array([tokens]), np.arange(prompt)])[0]
    loaded = _rss() - before
    start = time.perf_counter()
    for position in range(prompt, prompt + new_tokens):
        tokens.append(int(np.argmax(np.asarray(logits)[0])))
        logits = program.run_method("forward", [np.array([[tokens[-1]]]), np.array([position])])[0]
    seconds = time.perf_counter() - start
    print(json.dumps({"rank": program.rank, "rss": loaded, "tokens_per_s": new_tokens / seconds, "tokens": tokens}))


def _weights(path: str) -> int:
    from etmlx.inspection import inspect_program

    constants = {c["key"]: c for d in inspect_program(path)["methods"]["forward"]["delegates"] for c in d["constants"]}
    itemsize = {"bfloat16": 2}
    return sum(
        int(np.prod(c["shape"])) * itemsize.get(c["dtype"], np.dtype(c["dtype"]).itemsize) for c in constants.values()
    )


def _launch(directory, ranks: int, runtime: str, args) -> list:
    """One rank runs as a plain process, a group of one (``mlx.launch -n 1`` writes no usable hostfile)."""
    rank = [os.path.abspath(__file__), "--rank-of", directory, "--runtime", runtime,
            "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
    launch = [os.path.join(os.path.dirname(sys.executable), "mlx.launch"), "-n", str(ranks), "--backend", "ring", "--python"]
    command = [*(launch if ranks > 1 else []), sys.executable, *rank]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(results) != ranks:
        raise RuntimeError(f"{ranks} ranks gave {len(results)} results:\n{done.stdout}\n{done.stderr}")
    return sorted(results, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runtime", choices=etmlx.RUNTIMES, default="python")
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)  # run as one rank of mlx.launch
    args = parser.parse_args()
    if args.rank_of:
        return rank_main(args.rank_of, args.runtime, args.prompt, args.new_tokens)

    import llm
    from etmlx.llm import causal_lm

    capacity = args.prompt + args.new_tokens + 8
    model = llm.tiny_llama(hidden=args.hidden, layers=args.layers, max_cache=capacity).eval()
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"Llama hidden {args.hidden}, {args.layers} layers, {parameters / 2**20:.1f} MiB of float32 weights; "
          f"prompt {args.prompt}, {args.new_tokens} decode steps, {args.runtime} runtime, {os.cpu_count()} cores")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (1, 2):
            directory = os.path.join(tmp, f"tp{ranks}")
            etmlx.export_methods(lambda m: causal_lm.export_methods(m, max_seq_len=args.prompt), directory,
                                 tensor_parallel=ranks, model=model)
            weights = [_weights(os.path.join(directory, f"rank{r}.pte")) for r in range(ranks)]
            runs[ranks] = (_launch(directory, ranks, args.runtime, args), weights)
    single = runs[1][0][0]["tokens_per_s"]
    print(f"{'':<16}{'weights MiB':>12}{'resident MiB':>14}{'decode tok/s':>14}{'vs 1 rank':>11}")
    for ranks, (results, weights) in runs.items():
        for result, weight in zip(results, weights):
            name = f"{ranks} rank{'s' if ranks > 1 else ''}, rank {result['rank']}"
            print(f"{name:<16}{weight / 2**20:>12.1f}{result['rss'] / 2**20:>14.1f}{result['tokens_per_s']:>14.1f}"
                  f"{result['tokens_per_s'] / single:>10.2f}x")
    same = all(r["tokens"] == runs[1][0][0]["tokens"] for r in runs[2][0])
    print(f"greedy tokens of both ranks equal the single rank's: {same}")


if __name__ == "__main__":
    main()
