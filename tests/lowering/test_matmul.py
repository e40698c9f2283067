"""Parity of the matmul rules: mm, bmm, addmm (linear) and batched matmul."""

import pytest
import torch
from ruletest import delegated, dtype_shape_cases, lowered_directly, untested_rules


@pytest.mark.parametrize("dtype,shapes", dtype_shape_cases([((4, 8), (8, 3)), ((2, 5, 6), (6, 7)), ((2, 3, 4, 5), (2, 3, 5, 2))]))
def test_matmul(dtype, shapes):
    a, b = torch.randn(shapes[0], dtype=dtype), torch.randn(shapes[1], dtype=dtype)
    lowered = delegated(lambda a, b: a @ b, (a, b))
    assert lowered.nodes.count("Matmul") == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_an_outer_product_is_its_exact_broadcast_product(dtype, monkeypatch):
    """An inner size of 1 (a state-space scan's update in a decode step) runs as the
    broadcast product, which a matmul of one term equals value for value: also for
    infinities and NaN, and with batch entries broadcast. The Python runtime then calls
    no MLX matmul for it (the native runtime takes the same branch, runtime_shim's twin)."""
    import mlx.core as mx

    import etmlx

    a = torch.tensor([1.5, -0.0, float("inf"), float("nan"), 3.0, -2.25]).reshape(2, 1, 3, 1).expand(2, 3, 3, 1)
    a = (a * torch.linspace(0.5, 2.0, 3)[None, :, None, None]).to(dtype)
    b = torch.tensor([[[2.0, -1.0, 0.0, 7.5]]], dtype=dtype)  # (1, 1, 4): broadcast over the batch
    lowered = delegated(lambda a, b: a @ b, (a, b), nodes=["Matmul"])
    torch.testing.assert_close(lowered.program.forward(a, b), a @ b, rtol=0, atol=0, equal_nan=True)

    def no_matmul(*args, **kwargs):
        raise AssertionError("an outer product reached mx.matmul")

    monkeypatch.setattr(mx, "matmul", no_matmul)
    program = etmlx.load(lowered.pte)  # traced afresh, with mx.matmul refused
    torch.testing.assert_close(program.forward(a, b), a @ b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype,bias", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)],
                         ids=["f32-mm", "f32-addmm", "bf16-addmm"])
def test_one_row_times_a_linear_weight_is_taken_over_the_rows_as_stored(dtype, bias, monkeypatch):
    """On the CPU, one float32 row times a linear layer's weight (stored (out, in), read
    through a Transpose view) runs as the matrix-vector product ``W @ x`` over the rows
    as stored, the one BLAS reads fastest: the Python runtime hands MLX's product the
    stored matrix for a one-row call, the view for three rows and for bfloat16 (MLX's own
    loop); both runtimes match eager (the native runtime takes the same branch,
    runtime_shim's twin)."""
    import mlx.core as mx

    import etmlx

    linear = torch.nn.Linear(64, 48, bias=bias).to(dtype)
    one, three = torch.randn(1, 1, 64, dtype=dtype), torch.randn(3, 64, dtype=dtype)
    lowered = delegated(lambda one, three: (linear(one), linear(three)), (one, three),
                        nodes=["Transpose", "Addmm" if bias else "Matmul"])
    with torch.no_grad():
        expected = (linear(one), linear(three))
    for runtime in etmlx.RUNTIMES:
        torch.testing.assert_close(etmlx.load(lowered.pte, runtime=runtime).forward(one, three), expected)
    seen = []
    for name in ("matmul", "addmm"):
        def recorded(*operands, _product=getattr(mx, name), **options):
            seen.append([tuple(operand.shape) for operand in operands[-2:]])
            return _product(*operands, **options)

        monkeypatch.setattr(mx, name, recorded)
    etmlx.load(lowered.pte).forward(one, three)  # traced afresh, through the recording products
    one_row = [(48, 64), (64, 1)] if dtype == torch.float32 else [(1, 64), (64, 48)]
    assert sorted(seen) == sorted([one_row, [(3, 64), (64, 48)]])


@pytest.mark.parametrize("rows", [2, 16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_products_of_many_rows_are_taken_in_float32_on_the_cpu(dtype, rows, monkeypatch):
    """MLX's CPU matmul of half-precision operands is a scalar loop (10x BLAS's time at 128
    rows): from ``CPU_WIDENED_ROWS`` rows of the left operand on, both runtimes multiply
    in float32 and round back once. A linear layer (Addmm) and a matmul match eager on
    both runtimes either side of the bound; the Python runtime then hands MLX's products
    float32 operands only from the bound on (the native runtime takes the same branch)."""
    import mlx.core as mx

    import etmlx
    from runtime_shim.mlx_ops.matmul import CPU_WIDENED_ROWS

    assert 2 < CPU_WIDENED_ROWS <= 16
    linear = torch.nn.Linear(64, 48).to(dtype)
    x, y = torch.randn(rows, 64, dtype=dtype), torch.randn(64, 24, dtype=dtype)
    lowered = delegated(lambda x, y: (linear(x), x @ y), (x, y), nodes=["Addmm", "Matmul"])
    seen = []
    for name in ("matmul", "addmm"):
        def recorded(*operands, _product=getattr(mx, name), **options):
            seen.append({operand.dtype for operand in operands})
            return _product(*operands, **options)

        monkeypatch.setattr(mx, name, recorded)
    etmlx.load(lowered.pte).forward(x, y)  # traced afresh, through the recording products
    half = mx.float16 if dtype == torch.float16 else mx.bfloat16
    assert len(seen) == 2 and all(dtypes == ({mx.float32} if rows >= CPU_WIDENED_ROWS else {half})
                                  for dtypes in seen), seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_bmm_and_addmm(dtype):
    a, b = torch.randn(3, 4, 5, dtype=dtype), torch.randn(3, 5, 2, dtype=dtype)
    c, m1, m2 = torch.randn(2, dtype=dtype), torch.randn(4, 3, dtype=dtype), torch.randn(3, 2, dtype=dtype)

    def fn(a, b, c, m1, m2):
        return torch.bmm(a, b), torch.addmm(c, m1, m2), torch.addmm(c, m1, m2, beta=0.5, alpha=2.0)

    delegated(fn, (a, b, c, m1, m2), nodes=["Matmul", "Addmm"])


@pytest.mark.parametrize(
    "dtype,shape,bias",
    [(torch.float32, (3, 16), True), (torch.float16, (2, 4, 16), False), (torch.bfloat16, (2, 4, 16), True)],
    ids=["f32-2d-bias", "f16-3d", "bf16-3d-bias"],
)
def test_linear(dtype, shape, bias):
    linear = torch.nn.Linear(16, 8, bias=bias).to(dtype)
    lowered = delegated(linear, (torch.randn(shape, dtype=dtype),))
    assert ("Addmm" if bias else "Matmul") in lowered.nodes
    # the weight is stored as the module holds it, (out, in), and read through a Transpose view
    assert "Transpose" in lowered.nodes
    assert [c["shape"] for d in lowered.delegates for c in d["constants"] if len(c["shape"]) == 2] == [[8, 16]]


class TiedHead(torch.nn.Module):
    """An embedding table that is also the output projection (tied word embeddings)."""

    def __init__(self, vocab=40, width=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def test_a_head_tied_to_the_embedding_reads_the_one_stored_table():
    lowered = delegated(TiedHead(), (torch.tensor([[3, 1, 4, 1, 5]]),), nodes=["Transpose", "Matmul"])
    tables = [c for d in lowered.delegates for c in d["constants"] if sorted(c["shape"]) == [16, 40]]
    assert [c["shape"] for c in tables] == [[40, 16]]  # not a second, transposed copy for the head


def test_matmul_rule_lowered_directly():
    """Edge decomposes aten::matmul into mm/bmm before partitioning today."""
    a, b = torch.randn(2, 3, 4), torch.randn(4, 5)
    assert lowered_directly(lambda a, b: torch.ops.aten.matmul.default(a, b), (a, b)) == ["Matmul"]


def test_every_matmul_rule_is_tested(whole_file):
    assert untested_rules("matmul") == set()
