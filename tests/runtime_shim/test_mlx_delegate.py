"""The MLX delegate's load-time work (constants, hoisting) and its compiled graphs."""

import torch
from lowering_harness import check_parity

import etmlx


class ZerosOfTwoKinds(torch.nn.Module):
    """An int64 buffer and a float32 bias whose bytes are identical (all zero, 512 bytes):
    named data is content-addressed, so both share one key — but not one array."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ids", torch.zeros(1, 64, dtype=torch.int64))
        self.linear = torch.nn.Linear(64, 128)
        with torch.no_grad():
            self.linear.bias.zero_()

    def forward(self, x):
        return self.linear(x) + self.ids.sum()


def test_equal_bytes_of_different_dtypes_stay_distinct():
    lowered = check_parity(ZerosOfTwoKinds(), (torch.randn(3, 64),))
    (delegate,) = lowered.delegates
    keys = [c["key"] for c in delegate["constants"] if c["shape"] in ([1, 64], [128])]
    assert len(keys) == 2 and keys[0] == keys[1]  # the case this test is about


class ConstantOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(12.0).reshape(3, 4))

    def forward(self, x):
        return x + (self.table * 2).sum(0)


def test_nodes_reading_only_constants_run_once_at_load():
    from etmlx.runtime_shim.mlx_delegate import MlxDelegate
    from etmlx.runtime_shim.pte_file import read_pte
    from etmlx.runtime_shim.state import ProgramState

    lowered = check_parity(ConstantOnly(), (torch.randn(4),))
    pte = read_pte(lowered.pte)
    (delegate,) = pte.program.plans[0].delegates
    handle = MlxDelegate(pte.delegate_data(delegate), pte.named_data, ProgramState())
    assert lowered.nodes == ["Mul", "Sum", "Add"]
    assert len(handle._steps) == 1  # only the Add reads the input


def test_compiled_and_interpreted_runs_agree(monkeypatch):
    """By default a delegate runs under mx.compile from a call signature's second call;
    ETMLX_COMPILE=0 interprets the graph node by node. Both must give eager's numbers."""
    import runtimes
    from examples import models

    module, inputs, dynamic_shapes = models.encoder_block_dynamic_seq()
    lowered = check_parity(module, inputs, dynamic_shapes)
    monkeypatch.setenv("ETMLX_COMPILE", "0")
    interpreted = runtimes.load(lowered.pte)
    for seq in (3, 16, 40):
        tokens = torch.randint(0, 256, (2, seq))
        with torch.no_grad():
            expected = module(tokens)
        torch.testing.assert_close(interpreted.forward(tokens), expected, rtol=1e-5, atol=1e-5)
        for _ in range(2):  # interpreted, then compiled
            torch.testing.assert_close(lowered.program.forward(tokens), expected, rtol=1e-5, atol=1e-5)


def test_a_call_signature_is_compiled_from_its_second_call(monkeypatch):
    """A prompt's length is one call's shape: tracing it would only cost time and the
    trace's memory, held as long as the program. A signature is compiled on its second
    call, and a delegate keeps the most recently used MAX_COMPILED_GRAPHS."""
    from etmlx.runtime_shim import mlx_delegate
    from examples import models

    monkeypatch.setattr(mlx_delegate, "MAX_COMPILED_GRAPHS", 3)
    module, inputs, dynamic_shapes = models.encoder_block_dynamic_seq()
    program = etmlx.load(check_parity(module, inputs, dynamic_shapes).pte, runtime="python")
    (delegate,) = program._methods["forward"]._delegates
    compiled = lambda: [signature[0][0] for signature in delegate._compiled]  # noqa: E731  (the tokens' shapes)
    call = lambda seq: program.forward(torch.zeros(2, seq, dtype=torch.int64))  # noqa: E731
    for seq in (3, 4, 5):
        call(seq)
    assert compiled() == []
    for seq in (3, 4, 3, 5, 6, 6):
        call(seq)
    assert compiled() == [(2, 3), (2, 5), (2, 6)]  # 4 was the least recently used


def test_single_delegate_methods_run_directly_for_every_input_kind():
    """A method that is one MLX delegate skips the planned memory; torch, numpy (bf16 as
    uint16 bits) and mx inputs all come back as their own kind with the same values."""
    import mlx.core as mx
    import numpy as np

    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).to(torch.bfloat16).eval()
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    lowered = check_parity(module, (x,))
    program = lowered.program
    assert program.programs["python"]._direct["forward"] is not None
    from_torch = program.forward(x)
    from_numpy = program.forward(x.view(torch.uint16).numpy())
    from_mx = program.forward(mx.array(x.view(torch.uint16).numpy()).view(mx.bfloat16))
    assert isinstance(from_numpy, np.ndarray) and from_numpy.dtype == np.uint16
    assert isinstance(from_mx, mx.array) and from_mx.dtype == mx.bfloat16
    assert torch.equal(torch.from_numpy(from_numpy).view(torch.bfloat16), from_torch)
    assert torch.equal(torch.from_numpy(np.array(from_mx.view(mx.uint16))).view(torch.bfloat16), from_torch)
