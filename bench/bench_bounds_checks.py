"""What the run-time index bounds checks cost: the tiny Llama's decode step with its
CheckIndex nodes (token ids, KV-cache write positions) against the same program
exported without them, on both runtimes, measured interleaved in one run.

    python bench/bench_bounds_checks.py [--hidden 64 --layers 2]

The unchecked export patches the lowering so it emits no CheckIndex; on the Python
runtime a third program also runs without the clamp every gather applies to its indices
(traced with the clamp patched out): measurement devices only, not something etmlx offers.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import numpy as np  # noqa: E402
from etmlx.inspection import inspect_program  # noqa: E402
from etmlx.lowering.rules import indexing  # noqa: E402
from etmlx.runtime_shim.mlx_ops import indexing as python_gathers  # noqa: E402

import llm  # noqa: E402

PROMPT = list(range(3, 19))


def export(model, path: str, checked: bool) -> int:
    """Exports ``forward`` (transformers' whole-cache form); returns its CheckIndex count."""
    unchecked = lambda ctx, index, x, axis, wraps: ctx.tensor(index)  # noqa: E731
    patches = [] if checked else [mock.patch.object(indexing, "checked_index", unchecked)]
    for patch in patches:
        patch.start()
    try:
        etmlx.export_methods(llm.export_whole_cache_methods(model, max_seq_len=len(PROMPT)), path)
    finally:
        for patch in patches:
            patch.stop()
    (delegate,) = inspect_program(path)["methods"]["forward"]["delegates"]
    return delegate["nodes"].count("CheckIndex")


def decode_seconds(programs: dict, steps: int) -> dict:
    """Median seconds of one decode step per program, after a prefill, over ``steps``
    steps taken in turn (one step of each program, then the next position), so that
    the machine's drift hits every program alike."""
    for program in programs.values():
        program.forward(np.array([PROMPT]), np.arange(len(PROMPT)))
    times = {key: [] for key in programs}
    for position in range(len(PROMPT), len(PROMPT) + steps):
        for key, program in programs.items():
            start = time.perf_counter()
            program.forward(np.array([[position % 100]]), np.array([position]))
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    steps = 40
    model = llm.tiny_llama(hidden=args.hidden, layers=args.layers, max_cache=len(PROMPT) + steps + 8)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {checked: os.path.join(tmp, f"llm_{checked}.pte") for checked in (True, False)}
        counts = {checked: export(model, path, checked) for checked, path in paths.items()}
        print(f"Llama hidden {args.hidden}, {args.layers} layers: decode has {counts[True]} CheckIndex nodes "
              f"({counts[False]} unchecked); median decode step over {steps} steps, best of {args.rounds} rounds")
        for runtime in etmlx.RUNTIMES:
            programs = {name: etmlx.load(paths[name != "checked"], runtime=runtime) for name in ("checked", "unchecked")}
            if runtime == "python":
                programs["unclamped"] = _unclamped(paths[False])
            best = {name: float("inf") for name in programs}
            for _ in range(args.rounds):
                for name, seconds in decode_seconds(programs, steps).items():
                    best[name] = min(best[name], seconds)
            line = ", ".join(f"{name} {seconds * 1e3:.3f} ms" for name, seconds in best.items())
            print(f"  {runtime:<11} {line}: checks cost {(best['checked'] / best['unchecked'] - 1) * 100:+.1f}%")
            if "unclamped" in best:
                print(f"  {'':<11} checks and clamps cost {(best['checked'] / best['unclamped'] - 1) * 100:+.1f}%")


def _unclamped(path: str):
    """The Python runtime's program traced (mx.compile) with gathers taking their indices
    as they are; later calls replay those traces."""
    with mock.patch.object(python_gathers, "_in_bounds", lambda indices, size: indices):
        program = etmlx.load(path)
        decode_seconds({"trace": program}, 1)
    return program

if __name__ == "__main__":
    main()
