"""Shared timing for the benchmarks: median of repeated calls after warm-up."""

import statistics
import time


def median_seconds(fn, *args, warmup=3, repeat=30) -> float:
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_table(rows, baseline: str) -> None:
    """rows: [(name, seconds)]; prints ms per call and the ratio to ``baseline``."""
    base = dict(rows)[baseline]
    print(f"{'':<34}{'ms/call':>10}{'vs ' + baseline:>22}")
    for name, seconds in rows:
        print(f"{name:<34}{seconds * 1e3:>10.3f}{seconds / base:>21.2f}x")
