"""Timing calls the way the CLI, the demo and the benchmarks report them."""

import statistics
import time


def call_times(fn, *args, warmup: int = 3, repeat: int = 30) -> list:
    """Seconds of ``repeat`` calls, sorted, after ``warmup`` calls that fill caches,
    thread pools and mx.compile's traces."""
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)


def median_seconds(fn, *args, warmup: int = 3, repeat: int = 30) -> float:
    return statistics.median(call_times(fn, *args, warmup=warmup, repeat=repeat))
