"""Loading maps the file: a program of a few hundred MiB of weights is held once, also
while it loads (peak resident memory of a fresh process, bench/bench_load.py's child),
on both runtimes; a damaged mapped file is still refused by name."""

import copy
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import etmlx
from etmlx.inspection import inspect_program
from etmlx.runtime_shim.errors import PteFormatError

BENCH = pathlib.Path(__file__).parents[2] / "bench" / "bench_load.py"
WIDTH, DEPTH = 2048, 16  # sixteen fp32 weights of 16 MiB: a load holds one of them twice at most


class Chain(torch.nn.Module):
    """Square linears, and an 8 MiB buffer the call accumulates into."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(DEPTH)))
        self.register_buffer("total", torch.zeros(1024, WIDTH))

    def forward(self, x):
        self.total.add_(self.layers(x))
        return self.total[:1].clone()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Chain()
    for layer in model.layers:
        torch.nn.init.normal_(layer.weight, std=WIDTH**-0.5)
    path = tmp_path_factory.mktemp("mapped") / "chain.pte"
    example = torch.randn(1, WIDTH)
    with torch.no_grad():
        expected = copy.deepcopy(model)(example)  # a copy: the call adds into its buffer
    etmlx.export(model, (example,), path)
    return path, example, expected


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak memory is read from /proc (Linux)")
@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_a_load_holds_the_weights_once_also_while_loading(exported, runtime):
    path, _, _ = exported
    held = inspect_program(path)["held_bytes"]
    need = held["constants"] + held["buffers"]
    assert need >= DEPTH * WIDTH * WIDTH * 4  # the weights are the delegate's constants, not kernel inputs
    child = subprocess.run([sys.executable, str(BENCH), "--child", runtime, str(path)], capture_output=True,
                           text=True, check=True)
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    assert measured["peak"] < 1.2 * need, (measured, need)
    assert measured["after"] < 1.1 * need, (measured, need)


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_a_mapped_program_computes_what_the_model_does(exported, runtime):
    path, example, expected = exported
    program = etmlx.load(path, runtime=runtime)
    np.testing.assert_allclose(program.forward(example), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_a_truncated_mapped_file_is_refused_by_name(exported, runtime, tmp_path):
    path, _, _ = exported
    data = path.read_bytes()
    for keep in (0, 7, len(data) // 2, len(data) - 1):
        damaged = tmp_path / f"cut{keep}.pte"
        damaged.write_bytes(data[:keep])
        with pytest.raises(PteFormatError, match="truncated|too short|out of range"):
            etmlx.load(damaged, runtime=runtime)
