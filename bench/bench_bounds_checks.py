"""What the run-time index bounds checks cost: the tiny Llama's decode step with its
CheckIndex nodes (token ids, KV-cache write positions) against the same program
exported without them, on both runtimes, measured interleaved in one run.

    python bench/bench_bounds_checks.py [--hidden 64 --layers 2]

The unchecked export patches the lowering so it emits no CheckIndex: a measurement
device only, not something etmlx offers.
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
from etmlx.lowering.rules import indexing, shape  # noqa: E402

import llm  # noqa: E402

PROMPT = list(range(3, 19))


def export(model, path: str, checked: bool) -> int:
    """Exports prefill and decode; returns the decode method's CheckIndex count."""
    unchecked = lambda ctx, index, x, axis, wraps: ctx.tensor(index)  # noqa: E731
    patches = [] if checked else [mock.patch.object(m, "checked_index", unchecked) for m in (indexing, shape)]
    for patch in patches:
        patch.start()
    try:
        etmlx.export_methods(llm.export_methods(model, max_prompt=len(PROMPT)), path)
    finally:
        for patch in patches:
            patch.stop()
    (delegate,) = inspect_program(path)["methods"]["decode"]["delegates"]
    return delegate["nodes"].count("CheckIndex")


def decode_seconds(programs: dict, steps: int) -> dict:
    """Median seconds of one decode step per program, after a prefill, over ``steps``
    steps taken in turn (one step of each program, then the next position), so that
    the machine's drift hits every program alike."""
    for program in programs.values():
        program.prefill(np.array([PROMPT]), np.arange(len(PROMPT)))
    times = {key: [] for key in programs}
    for position in range(len(PROMPT), len(PROMPT) + steps):
        for key, program in programs.items():
            start = time.perf_counter()
            program.decode(np.array([[position % 100]]), np.array([position]))
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
            programs = {checked: etmlx.load(path, runtime=runtime) for checked, path in paths.items()}
            best = {True: float("inf"), False: float("inf")}
            for _ in range(args.rounds):
                for checked, seconds in decode_seconds(programs, steps).items():
                    best[checked] = min(best[checked], seconds)
            print(f"  {runtime:<11} checked {best[True] * 1e3:.3f} ms, unchecked {best[False] * 1e3:.3f} ms: "
                  f"checks cost {(best[True] / best[False] - 1) * 100:+.1f}%")


if __name__ == "__main__":
    main()
