"""The benchmarks' report: ms per call and ratios against a baseline, from one run."""

import time


def print_table(rows, baseline: str) -> None:
    """rows: [(name, seconds)]; prints ms per call and the ratio to ``baseline``."""
    base = dict(rows)[baseline]
    print(f"{'':<34}{'ms/call':>10}{'vs ' + baseline:>22}")
    for name, seconds in rows:
        print(f"{name:<34}{seconds * 1e3:>10.3f}{seconds / base:>21.2f}x")


def best_of(repeats: int, run) -> tuple:
    """(the least seconds of ``repeats`` calls of ``run`` after one that warms up, its
    last result)."""
    result, times = None, []
    for _ in range(repeats + 1):  # the first: compiles and warms the caches
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return min(times[1:]), result
