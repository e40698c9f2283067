"""Programs exported by plain ExecuTorch (no delegate) run and match eager PyTorch."""

import mlx.core as mx
import numpy as np
import pytest
import torch

from etmlx.runtime_shim import InputError, load, read_pte


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ViewChain(torch.nn.Module):
    """Static views are elided into aliases: every step reads the previous through the arena."""

    def forward(self, x):
        y = (x + 1).view(4, 6).t().reshape(2, 12)
        z = y.view(24)[3:].view(3, 7) * 2
        return z.sum(0), y


class DynamicBatch(torch.nn.Module):
    def forward(self, x):
        return (x * 2).view(x.shape[0], -1).sum(1), x.shape[0] * torch.ones(1)


class Mixed(torch.nn.Module):
    def forward(self, i, b, d):
        masked = d.masked_fill(b, float("-inf"))
        return i * 3 + 1, b.logical_not(), masked.exp(), (i > 2) & b


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.arange(3, dtype=torch.float32))

    def forward(self, x):
        self.buf.add_(x)
        return self.buf * 2


class BF16(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4).to(torch.bfloat16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def test_mlp(export):
    torch.manual_seed(0)
    model = MLP()
    x = _rand(5, 8)
    prog = load(export(model, (x,)))
    torch.testing.assert_close(prog.forward(x), model(x), rtol=1e-6, atol=1e-6)


def test_view_chain_aliases(export):
    model = ViewChain()
    x = _rand(2, 3, 4)
    pte = export(model, (x,))
    plan = read_pte(pte).program.plans[0]
    offsets = [v.allocation for v in plan.values if hasattr(v, "allocation") and v.allocation]
    assert len(offsets) > len(set(offsets)), "expected planned values sharing an offset"
    got = load(pte).forward(x)
    for g, want in zip(got, model(x)):
        torch.testing.assert_close(g, want)


def test_dynamic_batch_two_sizes(export):
    batch = torch.export.Dim("batch", min=1, max=8)
    model = DynamicBatch()
    prog = load(export(model, (_rand(3, 2, 2),), dynamic_shapes={"x": {0: batch}}))
    for n in (3, 7, 1):
        x = _rand(n, 2, 2)
        got = prog.forward(x)
        want = model(x)
        assert got[0].shape == (n,)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])


def test_int_bool_float64_and_inf(export):
    model = Mixed()
    args = (torch.tensor([1, 2, 3, 4]), torch.tensor([True, False, True, False]), torch.randn(4, dtype=torch.float64))
    got = load(export(model, args)).forward(*args)
    for g, want in zip(got, model(*args)):
        assert g.dtype == want.dtype
        torch.testing.assert_close(g, want)
    assert got[2][0] == 0.0  # exp(-inf): the -inf fill value survived serialization


def test_mutable_buffer_state_across_calls(export):
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["buf"])])
    with pytest.warns(UserWarning, match="Mutation on a buffer"):
        pte = export(Stateful(), (_rand(3),), config=config)
    prog, eager = load(pte), Stateful()
    for _ in range(3):
        x = _rand(3)
        torch.testing.assert_close(prog.forward(x), eager(x))
    assert load(pte).forward(torch.zeros(3)).tolist() == [0.0, 2.0, 4.0], "a fresh load starts from the initial value"


def test_bfloat16(export):
    torch.manual_seed(0)
    model = BF16()
    x = _rand(3, 8, dtype=torch.bfloat16)
    prog = load(export(model, (x,)))
    got = prog.forward(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, model(x))
    # numpy callers pass and get bfloat16 as uint16 bits
    bits = prog.forward(x.view(torch.uint16).numpy())
    assert bits.dtype == np.uint16
    torch.testing.assert_close(torch.from_numpy(bits).view(torch.bfloat16), model(x))


def test_multiple_methods():
    from executorch.exir import to_edge

    class Add(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Mul(torch.nn.Module):
        def forward(self, x):
            return x * 3

    x = _rand(2, 2)
    eps = {"forward": torch.export.export(Add(), (x,)), "triple": torch.export.export(Mul(), (x,))}
    prog = load(to_edge(eps).to_executorch().buffer)
    assert sorted(prog.method_names) == ["forward", "triple"]
    torch.testing.assert_close(prog.forward(x), x + 1)
    torch.testing.assert_close(prog.triple(x), x * 3)
    torch.testing.assert_close(prog.run_method("triple", [x])[0], x * 3)


@pytest.fixture(scope="module")
def mlp_prog(export):
    torch.manual_seed(0)
    model = MLP()
    return model, load(export(model, (_rand(5, 8),)))


def test_output_kind_follows_first_input(mlp_prog):
    model, prog = mlp_prog
    x = np.random.default_rng(0).standard_normal((5, 8), dtype=np.float32)
    want = model(torch.from_numpy(x)).detach().numpy()
    out_np = prog.forward(x)
    assert isinstance(out_np, np.ndarray)
    out_mx = prog.forward(mx.array(x))
    assert isinstance(out_mx, mx.array)
    np.testing.assert_allclose(np.array(out_mx), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_np, want, rtol=1e-5, atol=1e-6)


def test_outputs_are_copies(mlp_prog):
    _, prog = mlp_prog
    first = prog.forward(np.ones((5, 8), np.float32))
    kept = first.copy()
    prog.forward(np.zeros((5, 8), np.float32))
    np.testing.assert_array_equal(first, kept)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ((np.ones((5, 8)),), "forward: input 0 has dtype float64, expected float32"),
        ((np.ones((5, 9), np.float32),), r"forward: input 0 has shape \(5, 9\), expected \(5, 8\)"),
        ((np.ones(8, np.float32),), r"forward: input 0 has shape \(8,\), expected \(5, 8\)"),
        ((), "forward: expected 1 inputs, got 0"),
        (("x",), "forward: input 0 is a str, expected a float32 tensor"),
    ],
)
def test_bad_inputs(mlp_prog, inputs, message):
    _, prog = mlp_prog
    with pytest.raises(InputError, match=message):
        prog.forward(*inputs)


def test_dynamic_input_over_bound(export):
    batch = torch.export.Dim("batch", min=1, max=8)
    prog = load(export(DynamicBatch(), (_rand(3, 2, 2),), dynamic_shapes={"x": {0: batch}}))
    with pytest.raises(InputError, match=r"input 0 has shape \(9, 2, 2\), expected \(<=8, <=2, <=2\)"):
        prog.forward(_rand(9, 2, 2))


def test_unknown_method(mlp_prog):
    with pytest.raises(AttributeError, match="no method .*backward"):
        mlp_prog[1].backward


class ChannelsLast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)) + 1


def test_channels_last_dim_order(export):
    torch.manual_seed(0)
    model = ChannelsLast()
    x = _rand(2, 3, 6, 6).to(memory_format=torch.channels_last)
    pte = export(model, (x,))
    assert any(getattr(v, "dim_order", None) == (0, 2, 3, 1) for v in read_pte(pte).program.plans[0].values)
    torch.testing.assert_close(load(pte).forward(x), model(x))
