"""``etmlx serve`` against ``mlx_lm.server`` on the same checkpoint folder: N clients
stream chat completions at once (the official ``openai`` client, greedy, distinct
prompts); aggregate generated tokens per second and time to first token (p50, p99),
per server, in one run.

    python bench/bench_serve.py [--hidden 1024 --layers 8 --clients 1 4 8 --max-tokens 64]

The checkpoint is a random-weight Llama of that shape (float32, examples/llm.py's
128-token tokenizer), written here and exported with ``etmlx export-llm``; mlx_lm.server
loads the folder itself, in a process that imports etmlx first so that its MLX runs on
the same BLAS. etmlx serves one request at a time on one KV cache, so N clients queue;
mlx_lm.server decodes up to 32 requests in one batch.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


# mlx_lm.server's own entry point, after etmlx has put OpenBLAS under MLX (runtime_shim/blas.py)
MLX_LM_SERVER = "import sys, runpy, etmlx; sys.argv[0] = 'mlx_lm.server'; runpy.run_module('mlx_lm.server', run_name='__main__')"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list, port: int, log: str):
    """The server process, once it answers /health."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    for _ in range(1200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"{command[0]} exited: {open(log).read()[-2000:]}")
            time.sleep(0.25)
    raise SystemExit(f"{command} did not start")


def round_of(client, model: str, clients: int, max_tokens: int, salt: str) -> list:
    """Each client's (seconds to its first token, tokens, finish time); and the start."""
    results, started = [None] * clients, time.perf_counter()

    def ask(index):
        begun, first, chunks = time.perf_counter(), None, 0
        usage = None
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"{salt} request {index}: the quick brown fox"}],
            max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                chunks += 1
            usage = chunk.usage or usage
        results[index] = (first - begun, usage.completion_tokens if usage else chunks, time.perf_counter())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, started


def measure(url: str, model: str, clients: int, max_tokens: int, rounds: int) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    round_of(client, model, 1, 4, "warm-up")
    firsts, rates = [], []
    for r in range(rounds):
        results, started = round_of(client, model, clients, max_tokens, f"round {r} of {clients}")
        firsts += [first for first, _, _ in results]
        rates.append(sum(tokens for _, tokens, _ in results) / (max(end for _, _, end in results) - started))
    firsts.sort()
    return {"tokens/s": statistics.mean(rates), "ttft p50": statistics.median(firsts),
            "ttft p99": firsts[min(len(firsts) - 1, round(0.99 * (len(firsts) - 1)))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runtime", choices=("python", "executorch"), default="python")
    args = parser.parse_args()

    from examples import llm
    from etmlx.cli import main as etmlx

    bin_dir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as work:
        checkpoint = llm.tiny_checkpoint(os.path.join(work, "checkpoint"), max_cache=args.context,
                                         hidden=args.hidden, layers=args.layers)
        pte = os.path.join(work, "model", "model.pte")
        assert etmlx(["export-llm", checkpoint, "-o", pte, "--max-context", str(args.context)]) == 0
        servers = {  # name: (command, the model's name in requests)
            f"etmlx serve ({args.runtime})": ([os.path.join(bin_dir, "etmlx"), "serve", pte, "--runtime", args.runtime,
                                               "--model-name", "bench"], "bench"),
            "mlx_lm.server": ([sys.executable, "-c", MLX_LM_SERVER, "--model", checkpoint, "--log-level", "WARNING"],
                              "default_model"),
        }
        table = {}
        for name, (command, model) in servers.items():
            port = free_port()
            process = start(command + ["--port", str(port)], port, os.path.join(work, f"{len(table)}.log"))
            try:
                for clients in args.clients:
                    table[name, clients] = measure(f"http://127.0.0.1:{port}/v1", model, clients, args.max_tokens,
                                                   args.rounds)
                    print(name, clients, table[name, clients], flush=True)
            finally:
                process.terminate()
                process.wait(30)
    from etmlx.runtime_shim.blas import preload_openblas

    print(f"\nLlama-shaped, hidden {args.hidden}, {args.layers} layers, float32, {args.max_tokens} tokens per reply, "
          f"{args.rounds} rounds; {os.cpu_count()} cores; BLAS: {preload_openblas()}")
    print("| clients | server | tokens/s | TTFT p50 | TTFT p99 | tokens/s vs mlx_lm.server |")
    print("|---|---|---|---|---|---|")
    for clients in args.clients:
        reference = table["mlx_lm.server", clients]["tokens/s"]
        for name in servers:
            row = table[name, clients]
            print(f"| {clients} | {name} | {row['tokens/s']:.1f} | {row['ttft p50'] * 1e3:.0f} ms | "
                  f"{row['ttft p99'] * 1e3:.0f} ms | {row['tokens/s'] / reference:.2f}x |")


if __name__ == "__main__":
    main()
