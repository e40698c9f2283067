"""Exports the example models to .pte files, runs them on both runtimes — etmlx's
Python runtime and ExecuTorch's C++ runtime with etmlx's native backend — and compares
with eager PyTorch: max absolute difference and time per call.

    python examples/demo.py            # writes out/*.pte (needs `make native` first)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import etmlx  # noqa: E402  (first, so mlx runs on OpenBLAS where available)
import torch  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402
from etmlx.timing import median_seconds  # noqa: E402

import models  # noqa: E402

EXAMPLES = ["mlp", "cnn", "encoder_block", "encoder_block_dynamic_seq"]


def main() -> None:
    os.makedirs("out", exist_ok=True)
    print(f"BLAS: {preload_openblas()}; ms per call, median of 30")
    runtimes = {"python": "python", "executorch": "native"}  # runtime -> column label
    print(f"{'model':<27}{'delegated':>10}" + "".join(f"{'|diff| ' + r:>14}{r + ' ms':>11}" for r in runtimes.values())
          + f"{'eager ms':>10}")
    for name in EXAMPLES:
        module, inputs, dynamic_shapes = getattr(models, name)()
        path = os.path.join("out", f"{name}.pte")
        result = etmlx.export(module, inputs, path, dynamic_shapes=dynamic_shapes)
        row = f"{name:<27}{'all' if result.report.fully_delegated else 'partly':>10}"
        with torch.no_grad():
            expected = module(*inputs)
            for runtime in runtimes:
                program = etmlx.load(path, runtime=runtime)
                diff = (program.forward(*inputs) - expected).abs().max().item()
                row += f"{diff:>14.2e}{median_seconds(program.forward, *inputs) * 1e3:>11.3f}"
            row += f"{median_seconds(module, *inputs) * 1e3:>10.3f}"
        print(row)
    print("wrote", ", ".join(os.path.join("out", f"{n}.pte") for n in EXAMPLES))


if __name__ == "__main__":
    main()
