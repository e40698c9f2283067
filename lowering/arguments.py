"""An operator call's arguments, bound by name from the operator's schema.

A graph node keeps its arguments as the tracer wrote them: some positional, some
keywords, defaults left out (``sum(x, [1])`` and ``sum(x, [1], keepdim=False)`` are
the same call). ``bind`` normalizes them once, by the schema, the way PyTorch's
dispatcher reads them, so a rule's check and its lowering read ``args.keepdim`` and
agree on what the call means.
"""

import inspect
import weakref
from typing import Any

import torch
from torch import fx


class BoundArguments:
    """Read-only arguments of one call: ``args.self``, ``args.dim``, ... by schema name.

    An overload family can share a rule though its overloads name different arguments
    (``squeeze.dim`` has ``dim``, ``squeeze`` none): ``get`` reads those."""

    __slots__ = ("_values", "_op")

    def __init__(self, values: dict, op: str):
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_op", op)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{self._op} has no argument {name!r} (it has {', '.join(self._values)})") from None

    def __setattr__(self, name, value):
        raise AttributeError("bound arguments are read-only")

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def __repr__(self) -> str:
        return f"{self._op}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


_BOUND = weakref.WeakKeyDictionary()  # node -> (its args, its kwargs, their binding)


def bind(node: fx.Node) -> BoundArguments:
    """``node``'s arguments by name, with the schema's defaults filled in; bound once for
    the check and the lowering. Kept beside the node, not in ``node.meta``, which copied
    graphs copy (a copy's arguments are its own nodes); rebound when a pass has replaced
    the node's arguments (fx stores new tuples then)."""
    cached = _BOUND.get(node)
    if cached is not None and cached[0] is node.args and cached[1] is node.kwargs:
        return cached[2]
    args = _bind(node)
    _BOUND[node] = (node.args, node.kwargs, args)
    return args


def _bind(node: fx.Node) -> BoundArguments:
    """ATen, edge and custom operators have a schema; Python operators on sizes
    (``operator.mul``) are bound by their signature."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return _bind_signature(node)
    op = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    values = {}
    positional = list(node.args)
    if len(positional) > sum(not argument.kwarg_only for argument in schema.arguments):
        raise TypeError(f"{op} called with {len(positional)} positional arguments: {node.format_node()}")
    for index, argument in enumerate(schema.arguments):
        if index < len(positional):
            values[argument.name] = positional[index]
        elif argument.name in node.kwargs:
            values[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = _default(argument)
        else:
            raise TypeError(f"{op} called without its argument {argument.name!r}: {node.format_node()}")
    return BoundArguments(values, op)


# c10::ScalarType numbers: how a schema spells a dtype default (``ScalarType output_dtype=6``).
_SCALAR_TYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
    5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}


def _default(argument):
    """The schema's default, a dtype default as the ``torch.dtype`` a caller would pass."""
    value = argument.default_value
    if "ScalarType" in str(argument.real_type) and isinstance(value, int):
        return _SCALAR_TYPES[value]
    return value


def _bind_signature(node: fx.Node) -> BoundArguments:
    name = getattr(node.target, "__name__", str(node.target))
    bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return BoundArguments(dict(bound.arguments), name)


def bind_functionalized(node: fx.Node) -> BoundArguments:
    """The arguments of the mutating operator an ``auto_functionalized_v2`` node calls
    (``node.args[0]``): each mutated argument given as the base tensor it names
    (``_<name>_base_index`` into ``_all_bases``). Raises ValueError where a mutated
    argument is a view of its base (``_<name>_size`` and the like): then the op writes
    into part of a larger tensor."""
    schema = node.args[0]._schema
    bases, values = node.kwargs["_all_bases"], {}
    for argument in schema.arguments:
        name = argument.name
        if argument.alias_info is not None and argument.alias_info.is_write:
            if any(key.startswith(f"_{name}_") and key != f"_{name}_base_index" for key in node.kwargs):
                raise ValueError(f"its {name!r} is a view of a larger tensor")
            index = node.kwargs[f"_{name}_base_index"]
            values[name] = None if index is None else bases[index]
        elif name in node.kwargs:
            values[name] = node.kwargs[name]
        elif argument.has_default_value():
            values[name] = _default(argument)
        else:
            raise TypeError(f"{schema.name} called without its argument {name!r}: {node.format_node()}")
    return BoundArguments(values, schema.name)
