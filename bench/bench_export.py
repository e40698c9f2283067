"""Export time: etmlx's lowering path (``to_edge`` then ``to_backend``: one
decomposition pass) against ExecuTorch's ``to_edge_transform_and_lower`` with the same
partitioner (two passes), on the example encoder block and Llamas exported for the LLM
runner (``llama:HIDDEN:LAYERS:CACHE``; the tiny one by default). Warm: best of a few
exports in this process, the two interleaved, tracing apart. Cold: one export in a fresh
process, imports and tracing included.

    python bench/bench_export.py
    python bench/bench_export.py --models llama:1024:8:2048 --rounds 1
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

PATHS = ("etmlx", "transform_and_lower")
MODELS = ("encoder_block", "llama:64:2:64")


def _methods(model: str) -> dict:
    """``{method: ExportedProgram}`` of ``model``, traced once."""
    from etmlx.pipeline import trace

    if model == "encoder_block":
        from examples import models

        module, inputs, dynamic_shapes = models.encoder_block()
        return {"forward": trace(module, inputs, dynamic_shapes)}
    import llm

    hidden, layers, cache = (int(size) for size in model.split(":")[1:])
    return llm.export_methods(llm.tiny_llama(hidden=hidden, layers=layers, max_cache=cache))


def _lower(methods: dict, path: str) -> None:
    if path == "etmlx":
        from etmlx.pipeline import lower_methods

        lower_methods(methods)[0].buffer
        return
    from executorch.exir import to_edge_transform_and_lower

    from etmlx.partitioner import MlxPartitioner

    to_edge_transform_and_lower(dict(methods), partitioner=[MlxPartitioner()]).to_executorch().buffer


def _seconds(model: str, path: str):
    """Seconds of one lowering, or the error's first line where the path cannot export
    ``model`` (``to_edge_transform_and_lower``'s ``run_decompositions({})`` cannot retrace
    the LLM runner's window, read from ``cache_position`` by ``.item()``)."""
    methods = _methods(model)  # tracing is common to both paths: not timed
    start = time.perf_counter()
    try:
        _lower(methods, path)
    except Exception as error:  # reported in the table, as the path's result
        return f"fails: {str(error).strip().splitlines()[0][:70]}"
    return time.perf_counter() - start


def _cold_seconds(model: str, path: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--once", model, path], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--once", nargs=2, metavar=("MODEL", "PATH"), help="one export (the cold measurement)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=MODELS)
    args = parser.parse_args()
    import etmlx  # noqa: F401  (first: OpenBLAS under mlx)

    if args.once:
        model, path = args.once
        _lower(_methods(model), path)
        return
    print("lowering time in s (warm: tracing excluded; cold: a fresh process, imports and tracing included)")
    print(f"{'model':<20}{'path':<22}{'warm':>8}{'cold':>8}")
    for model in args.models:
        start = time.perf_counter()
        _methods(model)
        print(f"{model:<20}{'(tracing)':<22}{time.perf_counter() - start:>8.2f}")
        warm = {path: [_seconds(model, path) for _ in range(args.rounds)] for path in PATHS}
        timed = {path: min(runs) for path, runs in warm.items() if all(isinstance(r, float) for r in runs)}
        for path in PATHS:
            if path not in timed:
                print(f"{model:<20}{path:<22}  {next(r for r in warm[path] if isinstance(r, str))}")
                continue
            timed[path] = (timed[path], _cold_seconds(model, path))
            print(f"{model:<20}{path:<22}{timed[path][0]:>8.2f}{timed[path][1]:>8.2f}")
        if len(timed) == len(PATHS):
            (warm_a, cold_a), (warm_b, cold_b) = timed.values()
            print(f"{'':<20}{'etmlx / transform_and_lower':<22}{warm_a / warm_b:>8.2f}x{cold_a / cold_b:>7.2f}x")


if __name__ == "__main__":
    main()
