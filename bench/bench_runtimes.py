"""Per-call time of the two runtimes, in one run, on the small MLP (where per-call
overhead dominates) and the example encoder block: etmlx's Python runtime, the native
backend inside ExecuTorch's C++ runtime (through etmlx.load, through ExecuTorch's own
Python API, and from C++ with no Python at all: etmlx_run), against eager PyTorch and
the model written by hand in MLX. Then the resident memory of a loaded program against
the bytes of its weights, for both runtimes.

    make bench          (or: python bench/bench_runtimes.py)
"""

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import etmlx  # noqa: E402  (first: OpenBLAS under mlx)
import etmlx.native  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from etmlx.native_build import default_build_dir  # noqa: E402
from etmlx.runtime_shim.blas import preload_openblas  # noqa: E402
from etmlx.timing import median_seconds  # noqa: E402

from bench_encoder_block import mlx_encoder_block  # noqa: E402
from examples import models  # noqa: E402
from timing import print_table  # noqa: E402

CALLS = 200


def mlx_mlp(mlp):
    """The MLP by hand in MLX, weights transposed once."""
    w = {k: mx.array(v.detach().numpy()) for k, v in mlp.state_dict().items()}
    layers = [(w[f"{n}.bias"], w[f"{n}.weight"].T) for n in ("fc1", "fc2", "head")]
    mx.eval([t for pair in layers for t in pair])

    def forward(x):
        for i, (bias, weight) in enumerate(layers):
            x = mx.addmm(bias, x, weight)
            x = mx.maximum(x, 0) if i < 2 else x
        return x

    return lambda x: mx.eval(forward(x))


def native_cpp_seconds(path: str, inputs, tmp: str) -> float:
    """Median seconds per call of etmlx_run: ExecuTorch's Module API and the native
    backend in a C++ process (inputs in, outputs copied out, as an app does)."""
    files = []
    for i, x in enumerate(inputs):
        files.append(os.path.join(tmp, f"input_{i}.npy"))
        np.save(files[-1], x.numpy())
    run = subprocess.run(
        [str(default_build_dir() / "etmlx_run"), path, *files, "--repeat", str(CALLS + 1), "--output-dir", tmp],
        capture_output=True, text=True, check=True,
    )
    return float(re.search(r"median of the next \d+: ([\d.]+) ms", run.stdout).group(1)) / 1e3


def bench(name, module, inputs, by_hand, tmp):
    path = os.path.join(tmp, f"{name}.pte")
    etmlx.export(module, inputs, path)
    python = etmlx.load(path)
    native = etmlx.load(path, runtime="executorch")
    from executorch.runtime import Runtime

    stock = Runtime.get().load_program(path).load_method("forward")
    inputs_mx = [mx.array(x.numpy()) for x in inputs]
    with torch.no_grad():
        expected = module(*inputs)
        diffs = {
            "python": (python.forward(*inputs) - expected).abs().max().item(),
            "native": (native.forward(*inputs) - expected).abs().max().item(),
        }
        rows = [
            ("eager PyTorch", median_seconds(module, *inputs, repeat=CALLS)),
            ("python runtime (mx in/out)", median_seconds(python.forward, *inputs_mx, repeat=CALLS)),
            ("python runtime (torch in/out)", median_seconds(python.forward, *inputs, repeat=CALLS)),
            ("native, etmlx.load (torch)", median_seconds(native.forward, *inputs, repeat=CALLS)),
            ("native, ExecuTorch API (torch)", median_seconds(stock.execute, list(inputs), repeat=CALLS)),
            ("native, C++ etmlx_run", native_cpp_seconds(path, inputs, tmp)),
            ("MLX by hand (mx in/out)", median_seconds(by_hand, *inputs_mx, repeat=CALLS)),
        ]
    shapes = ", ".join(str(tuple(x.shape)) for x in inputs)
    print(f"\n{name} {shapes}: max |diff| vs eager: python {diffs['python']:.1e}, native {diffs['native']:.1e}")
    print_table(rows, baseline="python runtime (mx in/out)")
    return path, sum(t.numel() * t.element_size() for t in module.state_dict().values())


def resident_memory(path: str, runtime: str, inputs) -> tuple:
    """RSS growth (bytes) from loading and from a first call, in a fresh process whose
    baseline already holds the runtime's libraries."""
    np.save(path + ".x.npy", inputs[0].numpy())
    code = f"""
import etmlx, numpy as np
{"import etmlx.native, torch; from executorch.runtime import Runtime; Runtime.get()" if runtime == "executorch" else ""}
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) * 1024
x = np.load({path + ".x.npy"!r})
base = rss(); program = etmlx.load({path!r}, runtime={runtime!r}); loaded = rss()
program.forward(x); called = rss()
print(loaded - base, called - base)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def main() -> None:
    torch.manual_seed(0)
    print(f"BLAS: {preload_openblas()}; torch threads: {torch.get_num_threads()}; median of {CALLS} calls")
    with tempfile.TemporaryDirectory() as tmp:
        mlp, mlp_inputs, _ = models.mlp()
        bench("mlp", mlp.eval(), mlp_inputs, mlx_mlp(mlp), tmp)
        block, block_inputs, _ = models.encoder_block()
        path, weights = bench("encoder_block", block.eval(), block_inputs, mlx_encoder_block(block), tmp)
        if os.path.exists("/proc/self/status"):
            print(f"\nresident memory, encoder block ({weights / 2**20:.2f} MiB of weights), fresh process:")
            for runtime in etmlx.RUNTIMES:
                loaded, called = resident_memory(path, runtime, block_inputs)
                print(f"  {runtime:<12} load +{loaded / 2**20:.1f} MiB, after first call +{called / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
