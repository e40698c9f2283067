"""Export time: etmlx's lowering path (``to_edge`` then ``to_backend``: one
decomposition pass) against ExecuTorch's ``to_edge_transform_and_lower`` with the same
partitioner (two passes), on the example encoder block and the tiny Llama's
prefill+decode. Warm: best of a few exports in this process, the two interleaved.
Cold: one export in a fresh process, imports included.

    python bench/bench_export.py
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
MODELS = ("encoder_block", "tiny_llama")


def _methods(model: str) -> dict:
    """``{method: ExportedProgram}`` of ``model``, traced once."""
    from etmlx.exporter import trace

    if model == "encoder_block":
        from examples import models

        module, inputs, dynamic_shapes = models.encoder_block()
        return {"forward": trace(module, inputs, dynamic_shapes)}
    import llm

    return llm.export_methods(llm.tiny_llama())


def _lower(methods: dict, path: str) -> None:
    if path == "etmlx":
        from etmlx.exporter import lower_methods

        lower_methods(methods)[0].buffer
        return
    from executorch.exir import to_edge_transform_and_lower

    from etmlx.partitioner import MlxPartitioner

    to_edge_transform_and_lower(dict(methods), partitioner=[MlxPartitioner()]).to_executorch().buffer


def _seconds(model: str, path: str) -> float:
    methods = _methods(model)  # tracing is common to both paths: not timed
    start = time.perf_counter()
    _lower(methods, path)
    return time.perf_counter() - start


def _cold_seconds(model: str, path: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--once", model, path], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--once", nargs=2, metavar=("MODEL", "PATH"), help="one export (the cold measurement)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import etmlx  # noqa: F401  (first: OpenBLAS under mlx)

    if args.once:
        model, path = args.once
        _lower(_methods(model), path)
        return
    print("lowering time in s (warm: tracing excluded; cold: a fresh process, imports and tracing included)")
    print(f"{'model':<16}{'path':<22}{'warm':>8}{'cold':>8}")
    for model in MODELS:
        warm = {path: float("inf") for path in PATHS}
        for _ in range(args.rounds):
            for path in PATHS:
                warm[path] = min(warm[path], _seconds(model, path))
        cold = {path: _cold_seconds(model, path) for path in PATHS}
        for path in PATHS:
            print(f"{model:<16}{path:<22}{warm[path]:>8.2f}{cold[path]:>8.2f}")
        print(f"{'':<16}{'etmlx / transform_and_lower':<22}{warm['etmlx'] / warm[PATHS[1]]:>8.2f}x"
              f"{cold['etmlx'] / cold[PATHS[1]]:>7.2f}x")


if __name__ == "__main__":
    main()
