"""Exports the example models to .pte files, runs them with etmlx, and compares with
eager PyTorch: max absolute difference and time per call.

    python examples/demo.py            # writes out/*.pte
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
    print(f"BLAS: {preload_openblas()}")
    print(f"{'model':<28}{'delegated':>10}{'max |diff|':>13}{'etmlx ms':>10}{'eager ms':>10}")
    for name in EXAMPLES:
        module, inputs, dynamic_shapes = getattr(models, name)()
        path = os.path.join("out", f"{name}.pte")
        result = etmlx.export(module, inputs, path, dynamic_shapes=dynamic_shapes)
        program = etmlx.load(path)
        with torch.no_grad():
            expected = module(*inputs)
            diff = (program.forward(*inputs) - expected).abs().max().item()
            eager = median_seconds(module, *inputs)
        delegated = "all" if result.report.fully_delegated else "partly"
        ms = median_seconds(program.forward, *inputs) * 1e3
        print(f"{name:<28}{delegated:>10}{diff:>13.2e}{ms:>10.3f}{eager * 1e3:>10.3f}")
    print("wrote", ", ".join(os.path.join("out", f"{n}.pte") for n in EXAMPLES))


if __name__ == "__main__":
    main()
