"""DelegateCalls reach registered backends; a fully delegated program needs no torch."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import shim_fake_backend
from etmlx.runtime_shim import BackendError, TensorValue, describe, load, read_pte
from etmlx.runtime_shim import backends


class Partial(torch.nn.Module):
    """sin/mul/add go to the test backend; relu stays a portable kernel call."""

    def forward(self, x, y):
        return torch.relu(torch.sin(x) * y + y)


class Full(torch.nn.Module):
    def forward(self, x, y):
        return torch.sin(x) * y - x, x + y


def _lower(export, model, batch_max=8):
    from shim_aot_backend import TestPartitioner

    batch = torch.export.Dim("batch", min=1, max=batch_max)
    args = (torch.randn(3, 4), torch.randn(3, 4))
    return export(model, args, dynamic_shapes={"x": {0: batch}, "y": {0: batch}}, partitioner=TestPartitioner())


@pytest.fixture(scope="module")
def partial_pte(export):
    return _lower(export, Partial())


@pytest.fixture(scope="module")
def full_pte(export):
    return _lower(export, Full())


def test_partial_delegate_matches_eager(partial_pte):
    prog = load(partial_pte)
    for n in (5, 2):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        torch.testing.assert_close(prog.forward(x, y), Partial()(x, y))


def test_backend_receives_payload_specs_and_named_data(partial_pte):
    info = describe(partial_pte)
    (delegate,) = info.methods[0].delegates
    assert delegate.backend_id == shim_fake_backend.BACKEND_ID and delegate.processed_size > 0
    assert info.named_data == {shim_fake_backend.NAMED_KEY: 5}
    assert info.methods[0].kernel_calls == ["aten::relu.out"]
    shim_fake_backend.created.clear()
    prog = load(partial_pte)
    (handle,) = shim_fake_backend.created
    assert handle.compile_specs == {"mode": b"fast"} and handle.greeting == b"hello"
    for _ in range(3):
        prog.forward(torch.ones(2, 4), torch.ones(2, 4))
    assert handle.calls == 3, "one handle per loaded program, reused across calls"


def test_delegate_args_are_inputs_then_outputs(full_pte):
    seen = []

    class Recorder(shim_fake_backend.FakeHandle):
        def execute(self, args):
            seen.append([(type(a), a.shape) for a in args])
            super().execute(args)
            seen.append([a.shape for a in args])

    previous = backends._FACTORIES[shim_fake_backend.BACKEND_ID]
    backends.register_backend(shim_fake_backend.BACKEND_ID, Recorder)
    try:
        load(full_pte).forward(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32))
    finally:
        backends.register_backend(shim_fake_backend.BACKEND_ID, previous)
    # outputs arrive at their planned upper bound; the backend resizes them with .set
    assert seen == [[(TensorValue, (2, 4))] * 2 + [(TensorValue, (8, 4))] * 2, [(2, 4)] * 4]


def test_unregistered_backend(partial_pte, monkeypatch):
    monkeypatch.delitem(backends._FACTORIES, shim_fake_backend.BACKEND_ID)
    with pytest.raises(BackendError, match=f"delegate id '{shim_fake_backend.BACKEND_ID}' .*registered: "):
        load(partial_pte)


def test_mlx_backend_is_imported_on_demand():
    if importlib.util.find_spec("etmlx.runtime_shim.mlx_delegate") is None:
        with pytest.raises(BackendError, match="'EtMlxBackend'"):
            backends._factory("EtMlxBackend")
    else:
        assert callable(backends._factory("EtMlxBackend"))


def test_delegate_output_over_capacity(full_pte):
    class Oversized(shim_fake_backend.FakeHandle):
        def execute(self, args):
            args[2].set(np.zeros((9, 4), np.float32))

    previous = backends._FACTORIES[shim_fake_backend.BACKEND_ID]
    backends.register_backend(shim_fake_backend.BACKEND_ID, Oversized)
    try:
        prog = load(full_pte)
    finally:
        backends.register_backend(shim_fake_backend.BACKEND_ID, previous)
    with pytest.raises(Exception, match=r"shape \(9, 4\) exceeds the planned upper bound \(8, 4\)"):
        prog.forward(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32))


_NO_TORCH = textwrap.dedent(
    """
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")

    sys.meta_path.insert(0, BlockTorch())
    import numpy as np
    import shim_fake_backend
    from etmlx.runtime_shim import load

    prog = load(sys.argv[1])
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    y = np.full((2, 4), 0.5, np.float32)
    a, b = prog.forward(x, y)
    np.testing.assert_allclose(a, np.sin(x) * y - x, rtol=1e-6)
    np.testing.assert_allclose(b, x + y)
    assert "torch" not in sys.modules
    print("ok")
    """
)


def test_fully_delegated_program_runs_without_torch(full_pte, tmp_path):
    plan = read_pte(full_pte).program.plans[0]
    assert plan.operators == [], "the whole graph should be delegated"
    path = tmp_path / "full.pte"
    path.write_bytes(full_pte)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
