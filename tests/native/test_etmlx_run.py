"""etmlx_run: a .pte run by ExecuTorch's Module API and the native backend in a C++
program, with no Python in the process — the path an app takes."""

import subprocess

import numpy as np
import pytest
import torch

import etmlx
from etmlx.native_build import default_build_dir
from examples import models

RUNNER = default_build_dir() / "etmlx_run"


def _run(*args, cwd=None):
    return subprocess.run([str(RUNNER), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


class PartlyDelegated(torch.nn.Module):
    """A float64 cumsum (which MLX declines) between two delegated linear layers."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        middle = torch.cumsum(self.first(x).double(), dim=-1).float()
        return self.second(middle)


@pytest.mark.parametrize("case", ["encoder_block", "partly_delegated"])
def test_runs_a_method_and_writes_its_outputs(tmp_path, case):
    if case == "encoder_block":
        module, inputs, _ = models.encoder_block()
    else:
        module, inputs = PartlyDelegated().eval(), (torch.randn(3, 8),)
    result = etmlx.export(module, inputs, tmp_path / "model.pte")
    assert result.report.fully_delegated == (case == "encoder_block")
    paths = []
    for i, x in enumerate(inputs):
        paths.append(tmp_path / f"input_{i}.npy")
        np.save(paths[-1], x.numpy())
    run = _run(tmp_path / "model.pte", *paths, "--output-dir", tmp_path / "out", "--repeat", 3)
    assert run.returncode == 0, run.stderr
    assert "median of the next 2" in run.stdout
    with torch.no_grad():
        expected = module(*inputs)
    actual = torch.from_numpy(np.load(tmp_path / "out" / "output_0.npy"))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_bad_inputs_get_one_clear_error(tmp_path):
    module, inputs, _ = models.mlp()
    etmlx.export(module, inputs, tmp_path / "mlp.pte")
    np.save(tmp_path / "wrong_shape.npy", np.zeros((4, 63), np.float32))
    np.save(tmp_path / "wrong_dtype.npy", np.zeros((4, 64), np.int32))
    (tmp_path / "not.npy").write_bytes(b"hello")
    cases = {
        "wrong_shape.npy": "method 'forward' failed",
        "wrong_dtype.npy": "dtype '<i4', input 0 expects '<f4'",
        "not.npy": "not a .npy file",
        "missing.npy": "cannot open",
    }
    for name, message in cases.items():
        run = _run(tmp_path / "mlp.pte", tmp_path / name)
        assert run.returncode == 1 and message in run.stderr, (name, run.stderr)
        assert run.stderr.count("etmlx_run: error:") == 1
    run = _run(tmp_path / "missing.pte")
    assert run.returncode == 1 and "cannot load" in run.stderr


def test_a_damaged_payload_is_refused_with_the_reason(tmp_path):
    module, inputs, _ = models.mlp()
    etmlx.export(module, inputs, tmp_path / "mlp.pte")
    data = bytearray((tmp_path / "mlp.pte").read_bytes())
    data[data.index(b"EMLX") + 40] ^= 0x01
    (tmp_path / "damaged.pte").write_bytes(bytes(data))
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    run = _run(tmp_path / "damaged.pte", tmp_path / "x.npy")
    assert run.returncode == 1
    assert "payload corrupted: checksum mismatch" in run.stderr
