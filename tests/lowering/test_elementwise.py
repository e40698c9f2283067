"""Parity of the elementwise rules: arithmetic, comparisons, logic, activations."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lowering_harness import lower

import etmlx
from ruletest import DTYPE_IDS, FLOATS, Fn, dtype_shape_cases, declined, delegated, lowered_directly, untested_rules

aten = torch.ops.aten
BROADCASTS = [((2, 3), (2, 3)), ((4, 1, 3), (2, 1)), ((5,), ())]


@pytest.mark.parametrize("dtype,shapes", dtype_shape_cases(BROADCASTS))
def test_binary_arithmetic_broadcasts(dtype, shapes):
    a, b = torch.randn(shapes[0], dtype=dtype), torch.randn(shapes[1], dtype=dtype)

    def fn(a, b):
        return (
            a + b,
            torch.add(a, b, alpha=2),
            a - b,
            torch.sub(a, b, alpha=0.5),
            a * b,
            a / (b.abs() + 0.5),
            torch.maximum(a, b),
            torch.minimum(a, b),
            torch.pow(a.abs() + 0.5, b),
            a**2,
        )

    lowered = delegated(fn, (a, b), nodes=["Add", "Sub", "Mul", "Div", "Maximum", "Minimum", "Power"])
    assert lowered.nodes.count("Mul") >= 3  # the two alphas and a * b


@pytest.mark.parametrize("dtype", [torch.float16], ids=DTYPE_IDS.get)
def test_scalars_follow_torch_type_promotion(dtype):
    """Python scalars and 0-d tensors do not widen a half tensor (in MLX they would)."""
    x = torch.randn(3, 4, dtype=dtype)
    y0 = torch.tensor(1.7)  # a float32 0-d input
    c0 = torch.tensor(0.3)  # a float32 0-d constant

    def fn(x, y0):
        return (
            x + 2.5,
            x * c0,
            x - y0,
            3.0 - x,
            x / 3,
            aten.mul.Scalar(x, 1.5),
            aten.div.Scalar(x, 4.0),
            aten.add.Scalar(x, 2, alpha=3),
            aten.sub.Scalar(x, 0.25),
        )

    delegated(fn, (x, y0), nodes=["Add", "Sub", "Mul", "Div"])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_arithmetic(dtype):
    a = torch.tensor([[-7, -6, -1, 0, 1, 5, 7, 9]], dtype=dtype)
    b = torch.tensor([[2], [-3], [4]], dtype=dtype)

    def fn(a, b):
        return (
            a + b,
            torch.add(a, b, alpha=3),
            torch.sub(a, b, alpha=-2),
            a * b,
            a // b,
            a % b,
            a % 3,
            a % -4,
            torch.div(a, b, rounding_mode="floor"),
            a / b,  # true division of integers is float
            a + 1.5,  # an int tensor and a float scalar compute in float
            torch.maximum(a, b),
            -a,
            a.abs(),
            a.sign(),
            a**2,
        )

    delegated(fn, (a, b), nodes=["FloorDivide", "Remainder", "Div", "Neg", "Abs", "Sign", "Power"])


@pytest.mark.parametrize("dtype", [torch.float16], ids=DTYPE_IDS.get)
def test_floor_divide_and_remainder_of_negative_floats(dtype):
    a = torch.tensor([-7.5, -6.0, -1.25, 0.0, 1.0, 5.5, 7.0, 9.0], dtype=dtype)
    b = torch.tensor([[2.0], [-3.0], [0.75]], dtype=dtype)

    def fn(a, b):
        return a // b, a % b, a % 2.5, torch.remainder(a, -1.5)

    delegated(fn, (a, b), nodes=["FloorDivide", "Remainder"])


@pytest.mark.parametrize("dtype,shapes", dtype_shape_cases([((2, 3), (2, 3)), ((3, 1), (4,))], [torch.float16, torch.bfloat16, torch.int32]))
def test_comparisons_logic_and_where(dtype, shapes):
    a = torch.randint(-3, 4, shapes[0]).to(dtype)
    b = torch.randint(-3, 4, shapes[1]).to(dtype)

    def fn(a, b):
        return (
            a == b,
            a != b,
            a < b,
            a <= b,
            a > b,
            a >= b,
            a == 1,
            a != 0,
            a < 0.5,  # compared in float even for integer a
            a <= -1,
            a > 0,
            a >= 2.5,
            torch.logical_and(a > 0, b < 1),
            torch.logical_or(a > 1, b < -1),
            torch.logical_not(a > 0),
            torch.where(a > b, a, b),
            torch.where(a > 0, a, 0),
            torch.where(b < 0, -1, b),
        )

    lowered = delegated(fn, (a, b))
    for node in ["Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual"]:
        assert node in lowered.nodes
    for node in ["LogicalAnd", "LogicalOr", "LogicalNot", "Where"]:
        assert node in lowered.nodes


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64, torch.uint8])
def test_bitwise(dtype):
    a = torch.randint(0, 50, (3, 4)).to(dtype)
    b = torch.randint(0, 50, (1, 4)).to(dtype)
    lowered = delegated(lambda a, b: (a & b, a | b, a ^ b), (a, b))
    for node in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]:
        assert node in lowered.nodes


def test_half_compared_with_a_scalar_it_cannot_represent():
    """PyTorch rounds the scalar to half first: x == 0.1 is true for half(0.1)."""
    x = torch.tensor([0.1, 0.2, 0.0999], dtype=torch.float16)
    delegated(lambda x: (x == 0.1, x > 0.1, x <= 0.1), (x,), nodes=["Equal", "Greater", "LessEqual"])


UNARY_NODES = [
    "Neg", "Abs", "Exp", "Log", "Sqrt", "Rsqrt", "Reciprocal", "Sin", "Cos", "Tanh",
    "Sigmoid", "Erf", "Floor", "Ceil", "Maximum", "Sign", "GeluErf", "GeluTanh",
]  # fmt: skip


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(7,), (2, 3, 5)]))
def test_unary(dtype, shape):
    x = (torch.randn(shape) * 2).to(dtype)

    def fn(x):
        positive = x.abs() + 0.1
        return (
            -x,
            x.abs(),
            x.exp(),
            positive.log(),
            positive.sqrt(),
            positive.rsqrt(),
            positive.reciprocal(),
            x.sin(),
            x.cos(),
            x.tanh(),
            x.sigmoid(),
            x.erf(),
            x.floor(),
            x.ceil(),
            x.relu(),
            x.sign(),
            F.silu(x),
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
        )

    lowered = delegated(fn, (x,))
    for node in UNARY_NODES:
        assert node in lowered.nodes


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32], ids=str)
def test_clamp(dtype):
    x = (torch.randn(4, 5) * 3).to(dtype)
    low = (torch.randn(5) - 1).to(dtype)

    def fn(x, low):
        clamps = (
            x.clamp(min=-1),
            x.clamp(max=2),
            x.clamp(-2, 1),
            x.clamp(min=low),
            x.clamp(low, low + 2),
            x.clamp(max=low),
        )
        hardtanh = (F.hardtanh(x), F.hardtanh(x, -2.0, 0.5), F.relu6(x)) if dtype.is_floating_point else ()
        return clamps + hardtanh

    delegated(fn, (x, low), nodes=["Maximum", "Minimum"])


def test_float64_is_declined_but_correct():
    x = torch.randn(3, 4, dtype=torch.float64)
    reason = declined(lambda x: torch.relu(x * 2 + 1), (x,), "aten::mul.Tensor")
    assert "float64" in reason


def test_float64_inputs_delegate_nothing():
    x, y = torch.randn(2, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    module = Fn(lambda x, y: (x * y - y).exp())
    lowered = lower(module, (x, y))
    assert lowered.nodes == [] and lowered.delegates == []
    assert sorted(lowered.kernels) == ["aten::exp.out", "aten::mul.out", "aten::sub.out"]
    torch.testing.assert_close(lowered.program.forward(x, y), module(x, y))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float16], ids=str)
def test_trunc_division_and_trunc(dtype):
    a = torch.tensor([-7, 7, -5, 5, -6, 6, 0, -1]).to(dtype)
    b = torch.tensor([2, -2, 3, 3, -3, 4, 5, 2]).to(dtype)
    if dtype.is_floating_point:
        a, b = a * 1.3, b * 0.7

    def fn(a, b):
        return (
            torch.div(a, b, rounding_mode="trunc"), torch.div(a, 3, rounding_mode="trunc"),
            torch.div(a, b, rounding_mode="floor"), torch.trunc(a * 0.75 if dtype.is_floating_point else a),
        )

    delegated(fn, (a, b))
    div_scalar = lambda a: torch.ops.aten.div.Scalar_mode(a, -4, rounding_mode="trunc")  # noqa: E731
    assert lowered_directly(div_scalar, (a,))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_fmod_is_exact(dtype):
    """Bit for bit, sign of zero included: large quotients (where a - trunc(a / b) * b
    gives 1.0 for fmod(1e4, 3.3) = 1.000144...), signs, zeros, inf, NaN, a zero divisor."""
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([1e4, -1e4, 7.5, -7.5, 0.0, -0.0, -4.0, inf, 3.0, nan, 5.0, 2.5, 65000.0, -0.3])
    b = torch.tensor([3.3, 3.3, -2.0, 2.0, 3.0, 3.0, 2.0, 2.0, inf, 1.0, 0.0, nan, 0.7, 0.11])
    a, b = a.to(dtype), b.to(dtype)
    lowered = delegated(lambda a, b: (torch.fmod(a, b), torch.fmod(a, -0.7)), (a, b), nodes=["Remainder", "Where"])
    for got, expected in zip(lowered.program.forward(a, b), (torch.fmod(a, b), torch.fmod(a, -0.7))):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got.signbit() | got.isnan(), expected.signbit() | expected.isnan())


def test_integer_fmod_is_declined_but_correct():
    a, b = torch.tensor([-7, 7, 9]), torch.tensor([2, -3, 4])
    assert "zero divisor" in declined(lambda a, b: torch.fmod(a, b), (a, b), "aten::fmod.Tensor")


def test_rules_that_edge_decomposes_lowered_directly():
    """``silu``, ``rsub`` and ``floor_divide`` are decomposed before partitioning today;
    their rules still must compute what eager does."""
    x = torch.randn(3, 4)
    ints = (torch.tensor([-7, -1, 0, 5, 9]), torch.tensor([2, -3, 4, -1, 3]))
    assert "Silu" in lowered_directly(lambda x: aten.silu.default(x), (x,))
    assert lowered_directly(lambda x: aten.rsub.Scalar(x, 2.0, alpha=3), (x,)) == ["Scalar", "Mul", "Scalar", "Sub"]
    assert "FloorDivide" in lowered_directly(lambda a, b: aten.floor_divide.default(a, b), ints)


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(7,), (2, 3, 5)]))
def test_more_unary_and_activations(dtype, shape):
    x = (torch.randn(shape) * 2).to(dtype)

    def fn(x):
        unit = x.clamp(-0.9, 0.9)
        return (
            x.abs().log1p(), x.expm1(), unit.tan(), x.atan(), unit.asin(), unit.acos(), x.sinh(), x.cosh(),
            F.leaky_relu(x, 0.2), F.elu(x), F.elu(x, alpha=0.5), F.celu(x, alpha=2.0), F.selu(x),
        )

    lowered = delegated(fn, (x,))
    for node in ["Log1p", "Expm1", "Tan", "Atan", "Asin", "Acos", "Sinh", "Cosh", "Where"]:
        assert node in lowered.nodes


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(9,), (2, 3, 6)]))
def test_logs_rounding_inverse_hyperbolics_and_atan2(dtype, shape):
    """Rounding is half to even in both; special values included where they bite."""
    x = (torch.randn(shape) * 3).to(dtype)
    x.view(-1)[:4] = torch.tensor([0.5, 1.5, -2.5, 0.0])

    def fn(x):
        positive = x.abs() + 0.25
        unit = x.clamp(-0.95, 0.95)
        return (
            positive.log2(), positive.log10(), x.round(), x.asinh(), (positive + 1).acosh(), unit.atanh(),
            torch.atan2(x, positive - 1), torch.atan2(x, torch.tensor(-0.0, dtype=dtype)),
        )

    lowered = delegated(fn, (x,))
    for node in ["Log2", "Log10", "Round", "Asinh", "Acosh", "Atanh", "Atan2"]:
        assert node in lowered.nodes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_isnan_isinf(dtype):
    x = torch.tensor([[0, 1, -1, 7]]).to(dtype)
    if dtype.is_floating_point:
        x = torch.tensor([[0.0, float("nan"), float("inf"), -float("inf")]], dtype=dtype)
    lowered = delegated(lambda x: (x.isnan(), x.isinf(), torch.isfinite(x), x.nan_to_num(0.0)), (x,))
    assert "IsNan" in lowered.nodes and "IsInf" in lowered.nodes


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64], ids=str)
def test_bitwise_not_and_with_scalars(dtype):
    a = torch.tensor([[0, 1, 5, 100]]).to(dtype)
    if dtype in (torch.int8, torch.int32, torch.int64):
        a = torch.tensor([[0, -1, 5, -100]], dtype=dtype)
    scalar = True if dtype == torch.bool else 6
    lowered = delegated(lambda a: (~a, a & scalar, a | scalar, a ^ scalar), (a,))
    assert ("LogicalNot" if dtype == torch.bool else "BitwiseNot") in lowered.nodes


def test_negative_zero_keeps_its_sign():
    """mx.compile writes size-1 constants into its generated code as literals and drops
    the sign of -0.0: size-1 constants reach the graph as arguments."""
    x = torch.tensor([0.5, -1.5, 0.0, 2.0])

    def fn(x):
        return (
            torch.atan2(x.abs() * 0, torch.tensor(-0.0)), x * -0.0, 1 / torch.full_like(x, -0.0),
            1 / torch.full((2,), -0.0), F.pad(x, (1, 1), value=-0.0).reciprocal(),
        )

    delegated(fn, (x,), nodes=["Atan2"])
    assert all(torch.equal(torch.signbit(a), torch.signbit(e)) for a, e in zip(lower(Fn(fn), (x,)).program.forward(x), fn(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool], ids=str)
def test_logical_xor_and_a_number_to_a_tensor_power(dtype):
    a = torch.tensor([[0, 1, 2, 0], [3, 0, -1, 1]]).to(dtype)
    b = torch.tensor([[0, 0, 5, 7]]).to(dtype)
    fns = [lambda a, b: torch.logical_xor(a, b)]
    fns.append((lambda a, b: torch.logical_xor(~a, b)) if dtype == torch.bool else (lambda a, b: torch.pow(2, a.abs())))
    lowered = delegated(lambda a, b: tuple(fn(a, b) for fn in fns), (a, b), nodes=["NotEqual"])
    assert dtype == torch.bool or "Power" in lowered.nodes


def test_every_elementwise_rule_is_tested(whole_file):
    assert untested_rules("elementwise") == set()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_a_float_squared_is_a_product(dtype):
    """``x ** 2`` as ``x * x``, PyTorch's own computation: equal to the bit."""
    x = torch.tensor([0.0, -0.0, 1e-30, -3.5, 1e20, float("inf"), float("-inf"), float("nan"), 7.25]).to(dtype)
    lowered = delegated(lambda x: (x**2, x**2.0, x.pow(3)), (x,), nodes=["Mul", "Power"])
    assert lowered.nodes.count("Power") == 1
    torch.testing.assert_close(lowered.program.forward(x)[0], x**2, rtol=0, atol=0, equal_nan=True)


def test_erf_on_mlx_cpu_is_accurate_to_float32():
    """On MLX's CPU both runtimes compute erf (and GELU) as the rational function of
    serializer/fit_erf.py: within 4e-7 of the exact value everywhere (mx.erf: 5.3e-7),
    exact at the edges, and equal to each other to the bit."""
    x = torch.cat([torch.linspace(-6, 6, 200_001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 3.92, 40.0, -40.0,
                                                                 float("inf"), float("-inf"), float("nan")])])
    exact = torch.tensor([math.erf(v) for v in x.double().tolist()], dtype=torch.float64)
    lowered = lower(Fn(lambda x: (x.erf(), F.gelu(x), x.bfloat16().erf())), (x,))
    assert {"Erf", "GeluErf"} <= set(lowered.nodes)
    results = {runtime: etmlx.load(lowered.pte, runtime=runtime).forward(x) for runtime in etmlx.RUNTIMES}
    erf, gelu, erf_bf16 = results["python"]
    for other in results.values():
        torch.testing.assert_close(other, results["python"], rtol=0, atol=0, equal_nan=True)
    assert (erf.double() - exact).abs().nan_to_num().max() < 4e-7
    edges = erf[-10:]  # 0, -0, the two tiny values, the clamp, +-40, +-inf, nan
    assert edges[:2].tolist() == [0.0, -0.0] and edges[:2].signbit().tolist() == [False, True]
    assert edges[2:4].sign().tolist() == [1.0, -1.0] and edges[4:9].tolist() == [1.0, 1.0, -1.0, 1.0, -1.0]
    assert edges[9].isnan()
    # PyTorch's own GELU at +-inf depends on its CPU kernel (its AVX-512 one gives nan for
    # both); the formula it documents, x * (1 + erf(x / sqrt(2))) / 2, gives inf and nan
    finite = x.isfinite()
    torch.testing.assert_close(gelu[finite], F.gelu(x[finite]), rtol=0, atol=2e-6)
    assert gelu[-3] == math.inf and gelu[-2:].isnan().all()
    torch.testing.assert_close(erf_bf16, x.bfloat16().erf(), rtol=0, atol=4e-3, equal_nan=True)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit, a NaN's sign and payload aside (they follow operand order)."""
    nan = a.isnan()
    integers = torch.int32 if a.dtype == torch.float32 else torch.int16
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(integers), b[~nan].view(integers))


def _ulps(value: torch.Tensor, exact: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    spacing = torch.from_numpy(np.spacing(exact[where].float().numpy())).double()
    return (value.double() - exact).abs()[where] / spacing


def test_exp_sigmoid_and_silu_on_mlx_cpu_are_accurate_to_float32():
    """On MLX's CPU both runtimes compute e^x as 2^k * e^r (cpu_math.py): within 2 ulps
    wherever the result is a normal float32 (mx.exp's kernel: 9e-7 relative), 0 where
    it would be subnormal, inf past the range. Sigmoid comes from e^-|x|: within 3 ulps
    where normal, subnormal results kept until they round to 0; SiLU from it. Every
    result has the same bits on both runtimes, interpreted (a signature's first call)
    and compiled (its second): the forms avoid `where` for speed, not for exactness."""
    x = torch.cat([torch.linspace(-110, 100, 210_001),
                   torch.tensor([0.0, -0.0, 88.72, 88.73, -87.3, -87.4, float("inf"), float("-inf"), float("nan")])])
    lowered = lower(Fn(lambda x: (x.exp(), x.sigmoid(), F.silu(x), x.bfloat16().sigmoid())), (x,))
    assert {"Exp", "Sigmoid"} <= set(lowered.nodes)  # F.silu reaches the graph as x * sigmoid(x)
    calls = [program.forward(x) for runtime in etmlx.RUNTIMES
             for program in [etmlx.load(lowered.pte, runtime=runtime)] for _ in range(2)]
    for other in calls[1:]:
        assert all(_same_bits(a, b) for a, b in zip(other, calls[0]))
    exp, sigmoid, silu, sigmoid_bf16 = calls[0]
    exact = x.double().exp()
    normal = (exact > torch.finfo(torch.float32).tiny) & (exact < torch.finfo(torch.float32).max)
    assert _ulps(exp, exact, normal).max() <= 2
    edges, inf = exp[-9:], float("inf")  # 0, -0, 88.72, 88.73, -87.3, -87.4, inf, -inf, nan
    assert edges[:2].tolist() == [1.0, 1.0] and 3.3e38 < edges[2] < inf and edges[3] == inf
    assert edges[4] > 0 and edges[5] == 0 and edges[6:8].tolist() == [inf, 0.0] and edges[8].isnan()
    exact = x.double().sigmoid()
    assert _ulps(sigmoid, exact, exact > torch.finfo(torch.float32).tiny).max() <= 3
    subnormal = (x > -103) & (x < -88)
    assert (sigmoid[subnormal] > 0).all() and (sigmoid[x < -104] == 0).all()
    assert sigmoid[-9:-7].tolist() == [0.5, 0.5] and sigmoid[-3:-1].tolist() == [1.0, 0.0] and sigmoid[-1].isnan()
    torch.testing.assert_close(silu, F.silu(x), rtol=4e-7, atol=1e-30, equal_nan=True)
    torch.testing.assert_close(sigmoid_bf16, x.bfloat16().sigmoid(), rtol=0, atol=4e-3, equal_nan=True)
