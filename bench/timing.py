"""The benchmarks' report: ms per call and ratios against a baseline, from one run."""


def print_table(rows, baseline: str) -> None:
    """rows: [(name, seconds)]; prints ms per call and the ratio to ``baseline``."""
    base = dict(rows)[baseline]
    print(f"{'':<34}{'ms/call':>10}{'vs ' + baseline:>22}")
    for name, seconds in rows:
        print(f"{name:<34}{seconds * 1e3:>10.3f}{seconds / base:>21.2f}x")
