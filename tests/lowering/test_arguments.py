"""Arguments bound by the operator's schema: the one reading both halves of a rule share."""

import operator

import pytest
import torch
from torch import fx

from etmlx.lowering.arguments import bind

aten = torch.ops.aten


def _call(target, *args, **kwargs):
    graph = fx.Graph()
    x = graph.placeholder("x")
    return graph.call_function(target, (x, *args), kwargs), x


@pytest.mark.parametrize(
    "args,kwargs",
    [(([1],), {}), (([1], False), {}), (([1],), {"keepdim": False}), ((), {"dim": [1], "keepdim": False})],
    ids=["default", "positional", "keyword", "all-keywords"],
)
def test_spellings_of_one_call_bind_alike(args, kwargs):
    node, x = _call(aten.sum.dim_IntList, *args, **kwargs)
    bound = bind(node)
    assert (bound.self, bound.dim, bound.keepdim, bound.dtype) == (x, [1], False, None)


def test_keyword_only_defaults_are_filled():
    node, _ = _call(aten.add.Tensor, 2.0)
    assert bind(node).alpha == 1
    node, _ = _call(aten.add.Tensor, 2.0, alpha=3)
    assert bind(node).alpha == 3


def test_python_operators_bind_by_signature():
    node, x = _call(operator.mul, 4)
    assert (bind(node).a, bind(node).b) == (x, 4)


def test_an_unknown_name_says_which_the_operator_has():
    node, _ = _call(aten.relu.default)
    with pytest.raises(AttributeError, match="aten::relu has no argument 'dim' \\(it has self\\)"):
        bind(node).dim
    assert bind(node).get("dim", 7) == 7


def test_arguments_are_read_only():
    node, _ = _call(aten.relu.default)
    with pytest.raises(AttributeError, match="read-only"):
        bind(node).self = None


@pytest.mark.parametrize(
    "args,error",
    [((), "without its argument 'dim'"), (([1], False, None), "4 positional arguments")],
    ids=["missing", "too-many"],
)
def test_malformed_calls_are_named(args, error):
    node, _ = _call(aten.sum.dim_IntList, *args)
    with pytest.raises(TypeError, match=error):
        bind(node)


def test_a_node_is_rebound_after_a_pass_replaces_its_arguments():
    node, x = _call(aten.sum.dim_IntList, [1])
    assert bind(node).self is x
    y = node.graph.placeholder("y")
    node.replace_input_with(x, y)
    assert bind(node).self is y
    assert bind(node) is bind(node)  # and bound once while they stay


def test_a_dtype_default_binds_as_a_torch_dtype():
    """Schemas spell dtype defaults as c10::ScalarType numbers (``output_dtype=6``)."""
    from executorch.exir.scalar_type import ScalarType

    from etmlx.lowering.arguments import _SCALAR_TYPES

    import torchao  # noqa: F401  (registers torch.ops.torchao)

    c10_names = {"BYTE": torch.uint8, "CHAR": torch.int8, "SHORT": torch.int16, "INT": torch.int32, "LONG": torch.int64,
                 "HALF": torch.float16, "FLOAT": torch.float32, "DOUBLE": torch.float64, "BOOL": torch.bool,
                 "BFLOAT16": torch.bfloat16}
    assert {number: c10_names[ScalarType(number).name] for number in _SCALAR_TYPES} == _SCALAR_TYPES
    graph = fx.Graph()
    q, s = graph.placeholder("q"), graph.placeholder("s")
    node = graph.call_function(torch.ops.torchao.dequantize_affine.default, (q, [1, 32], s, None, torch.int8))
    assert bind(node).output_dtype is torch.float32


def test_every_rule_names_an_operator_that_exists():
    """A misspelt rule name would never match a call: its op would silently stay outside MLX."""
    import torchao  # noqa: F401  (registers torch.ops.torchao)

    import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (registers torch.ops.dim_order_ops)
    import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx)
    import etmlx.lowering.rules  # noqa: F401
    import dtype_samples  # noqa: F401  (defines the other operators the rules name: mlx::, torchao's int4, ...)
    from etmlx.lowering.registry import RULES

    for name in RULES:
        if name.startswith("_operator."):
            assert callable(getattr(operator, name.split(".")[1]))
            continue
        namespace, rest = name.split("::")
        op, _, overload = rest.partition(".")
        assert hasattr(getattr(getattr(torch.ops, namespace), op), overload or "default"), name
