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


def medians_in_turns(calls: dict, rounds: int = 4, block: int = 5) -> dict:
    """Median seconds of each of ``calls`` (name -> function of no arguments), taken in
    turns: each round runs each function once untimed (it fills the caches the others
    emptied) and then ``block`` timed calls in a row, so that each is timed as it runs
    alone while the machine's drift over the run (eager PyTorch's own time moved 2x
    between runs here) hits every one alike."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name] += call_times(call, warmup=1, repeat=block)
    return {name: statistics.median(values) for name, values in times.items()}
