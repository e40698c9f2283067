"""Run a KernelCall through ``torch.ops.<namespace>.<name>.<overload>``.

Imported only when a plan has such a call, since it imports torch. Tensor
arguments become torch tensors sharing the arena memory; ``out=`` tensors are
made resizable within their planned bytes (``TensorValue.torch_out``) and their
new shape is read back after the call.
"""

import torch

from . import pte_types as t
from .errors import OperatorError
from .prim_ops import int_list
from .tensor_value import TensorValue


def resolve_overload(op: t.Operator):
    namespace, _, name = op.name.partition("::")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), op.overload)
    except (AttributeError, RuntimeError):
        raise OperatorError(
            f"operator {op.qualified} is not available in torch.ops"
            " (the library that defines it must be imported first)"
        ) from None


def _torch_arg(values: list, value, is_out: bool, outs: list):
    if isinstance(value, TensorValue):
        if is_out:
            tensor = value.torch_out()
            outs.append((value, tensor))
            return tensor
        return value.to_torch()
    if isinstance(value, t.IntList):
        return int_list(values, value)
    if isinstance(value, (t.DoubleList, t.BoolList)):
        return list(value.items)
    if isinstance(value, t.TensorList):
        return [_torch_arg(values, values[i], is_out, outs) for i in value.items]
    if isinstance(value, t.OptionalTensorList):
        return [None if i == -1 else values[i].to_torch() for i in value.items]
    return value  # int, float, bool, str, None


def make_kernel(op: t.Operator, args: tuple):
    """A callable ``kernel(values)`` running ``op`` on the values at ``args``."""
    overload = resolve_overload(op)
    schema = overload._schema.arguments
    if len(args) < len(schema):
        raise OperatorError(f"{op.qualified} takes {len(schema)} arguments, the plan passes {len(args)}")
    spec = [(a.name, a.kwarg_only, a.is_out, i) for a, i in zip(schema, args)]
    returns = args[len(schema) :]
    is_out_variant = any(a.is_out for a in schema)
    if not is_out_variant and len(returns) > 1:
        raise OperatorError(f"{op.qualified}: functional operators with {len(returns)} returns are not supported")

    def kernel(values: list) -> None:
        positional, keywords, outs = [], {}, []
        for name, kwarg_only, is_out, index in spec:
            arg = _torch_arg(values, values[index], is_out, outs)
            if kwarg_only:
                keywords[name] = arg
            else:
                positional.append(arg)
        result = overload(*positional, **keywords)
        for value, tensor in outs:
            value.sync_from_torch(tensor)
        if not is_out_variant and returns:
            _store_return(values, returns[0], result)

    return kernel


def _store_return(values: list, index: int, result) -> None:
    """Put a functional (or in-place) operator's result where the plan expects it."""
    target = values[index]
    if isinstance(target, TensorValue):
        if result.data_ptr() == target.to_torch().data_ptr():
            target.resize(tuple(result.shape))  # in place: already there
        else:
            target.set_torch(result)
    else:
        values[index] = result.item() if isinstance(result, torch.Tensor) else result
