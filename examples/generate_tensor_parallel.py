"""Greedy generation with a tiny Hugging Face Llama split over 2 (or N) processes.

Export once, then start one process per rank with ``mlx.launch`` (here, two on this
machine; across Macs, ``--hosts`` or ``--hostfile``): each loads only its shard and
prints the same tokens, which rank 0 compares with eager PyTorch's.

    python examples/generate_tensor_parallel.py export out/llama_tp2 [--ranks 2]
    mlx.launch -n 2 --backend ring --python .venv/bin/python \\
        examples/generate_tensor_parallel.py run out/llama_tp2 [--runtime executorch]

``run`` needs only etmlx's runtime (mlx, numpy); rank 0 also imports torch, to compare.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import etmlx  # noqa: E402  (first, so mlx runs on OpenBLAS where available)
from etmlx.llm import causal_lm, generation  # noqa: E402

PROMPT = [5, 17, 42, 8, 99, 3]
NEW_TOKENS = 16


def greedy(program, prompt: list, new_tokens: int) -> tuple:
    """Greedy generation on a loaded program of ``causal_lm.export_methods``: the tokens,
    and the logits each call gave for the next one."""
    session = generation.Session(program)
    tokens, steps = list(prompt), [session.feed(list(prompt))]
    while True:
        tokens.append(int(np.argmax(steps[-1])))
        if len(tokens) == len(prompt) + new_tokens:
            return tokens, np.stack(steps)
        steps.append(session.feed([tokens[-1]]))


def export(directory: str, ranks: int) -> None:
    import llm

    result = etmlx.export_methods(causal_lm.export_methods, directory, tensor_parallel=ranks, model=llm.tiny_llama())
    print(f"wrote {directory}: {ranks} ranks; " + "; ".join(map(str, result.decisions)))


def run(directory: str, runtime: str) -> None:
    program = etmlx.load(directory, runtime=runtime)
    tokens, _ = greedy(program, PROMPT, NEW_TOKENS)
    print(f"rank {program.rank} of {program.size}: {tokens}")
    if program.rank == 0:
        import llm

        expected = llm.eager_greedy(llm.tiny_llama(), PROMPT, NEW_TOKENS)
        print(f"eager PyTorch's tokens {'match' if tokens == expected else 'DIFFER: ' + str(expected)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("export", "run"))
    parser.add_argument("directory")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runtime", choices=etmlx.RUNTIMES, default="python")
    args = parser.parse_args()
    if args.command == "export":
        export(args.directory, args.ranks)
    else:
        run(args.directory, args.runtime)


if __name__ == "__main__":
    main()
