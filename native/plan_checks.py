"""What ExecuTorch's runtime assumes of a program's plan without checking it: it
aborts (an ``ET_CHECK``) or writes through a null pointer instead of returning an
error. ``etmlx.load(path, runtime="executorch")`` checks these first, so a damaged
file ends in a ``PteFormatError``:

- each KernelCall passes the kinds of values its operator's schema takes (an ``int[]``
  where the schema says ``int[]``, ...), and as many as it takes;
- each list holds the kinds it claims (an ``int[]`` refers to ints, ...);
- every tensor a plan computes into is memory planned (only inputs and outputs, which
  the caller provides, may not be);
- the plan lists its memory-planned buffer sizes (ExecuTorch's writer always lists at
  least memory id 0; the runtime's Python bindings abort on a plan without the list);
- an integer ``mod`` or ``floordiv`` of its size arithmetic does not divide by a stored
  zero (or the least int64 by -1): ExecuTorch's prim ops trap (SIGFPE).
"""

from etmlx.runtime_shim import pte_types as t
from etmlx.runtime_shim.errors import PteFormatError


def check_program(program: t.Program) -> None:
    for plan in program.plans:
        if not plan.non_const_buffer_sizes:
            raise PteFormatError(f"method {plan.name!r}: the plan lists no memory-planned buffer sizes")
        _check_lists(plan)
        written = _check_kernel_arguments(plan)
        _check_divisors(plan, written)
        _check_planned(plan)


def _check_kernel_arguments(plan: t.ExecutionPlan) -> set:
    """Checks each KernelCall's arguments; returns the values the plan writes at run
    time (its inputs, kernels' results, delegates' arguments, moves' destinations)."""
    schemas, written = {}, set(plan.inputs)
    for index, ins in enumerate(plan.instructions):
        if isinstance(ins, t.DelegateCall):
            written.update(ins.args)
        elif isinstance(ins, t.MoveCall):
            written.add(ins.move_to)
        if not isinstance(ins, t.KernelCall):
            continue
        op = plan.operators[ins.op_index]
        if op.qualified not in schemas:
            schemas[op.qualified] = _schema(op)
        expected = [a.type for a in schemas[op.qualified].arguments]  # then its results, which ExecuTorch writes
        where = f"method {plan.name!r}, instruction {index} ({op.qualified})"
        if len(ins.args) <= len(expected):
            raise PteFormatError(f"{where}: passes {len(ins.args)} values, the operator takes {len(expected)} and returns")
        for position, (value_index, kind) in enumerate(zip(ins.args, expected)):
            value = plan.values[value_index]
            if not _accepts(kind, value):
                raise PteFormatError(f"{where}: argument {position} is a {type(value).__name__}, the operator takes {kind}")
        written.update(ins.args[len(expected) :])
    return written


_INTEGER_DIVISIONS = ("executorch_prim::mod.Scalar", "executorch_prim::floordiv.Scalar")
_INT64_MIN = -(1 << 63)


def _check_divisors(plan: t.ExecutionPlan, written: set) -> None:
    for index, ins in enumerate(plan.instructions):
        if not isinstance(ins, t.KernelCall) or plan.operators[ins.op_index].qualified not in _INTEGER_DIVISIONS:
            continue
        (a, b), stored = ins.args[:2], lambda i: None if i in written else plan.values[i]
        if stored(b) == 0 or (stored(b) == -1 and stored(a) == _INT64_MIN):
            raise PteFormatError(f"method {plan.name!r}, instruction {index} "
                                 f"({plan.operators[ins.op_index].qualified}): divides by a stored {stored(b)}")


def _check_lists(plan: t.ExecutionPlan) -> None:
    kinds = {t.IntList: (int,), t.TensorList: (t.TensorMeta,), t.OptionalTensorList: (t.TensorMeta, type(None))}
    for index, value in enumerate(plan.values):
        allowed = kinds.get(type(value))
        if allowed is None:
            continue
        for item in value.items:
            element = None if item == -1 else plan.values[item]
            if type(element) not in allowed:  # exact types: a bool is no int to ExecuTorch
                raise PteFormatError(
                    f"method {plan.name!r}: value {index}, a {type(value).__name__}, holds a {type(element).__name__}"
                )


def _schema(op: t.Operator):
    import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (defines dim_order_ops::*)
    import executorch.exir.passes.executorch_prim_ops_registry  # noqa: F401  (defines executorch_prim::*)

    from etmlx.runtime_shim.errors import OperatorError
    from etmlx.runtime_shim.torch_kernels import resolve_overload

    try:
        return resolve_overload(op)._schema
    except OperatorError as error:
        raise PteFormatError(str(error)) from None


_LISTS = {"IntType": t.IntList, "SymIntType": t.IntList, "FloatType": t.DoubleList, "BoolType": t.BoolList,
          "TensorType": t.TensorList}


def _accepts(kind, value) -> bool:
    """Whether ExecuTorch reads ``value`` (a decoded EValue) as the schema type ``kind``
    without an abort: its EValue accessors check the tag exactly (an Int is no Double)."""
    name = kind.kind()
    if name == "OptionalType":
        return value is None or _accepts(kind.getElementType(), value)
    if name == "TensorType":
        return isinstance(value, t.TensorMeta)
    if name in ("IntType", "SymIntType"):
        return type(value) is int
    if name == "FloatType":
        return type(value) is float
    if name == "BoolType":
        return type(value) is bool
    if name == "NumberType":
        return type(value) in (int, float, bool)
    if name == "StringType":
        return type(value) is str
    if name == "ListType":
        element = kind.getElementType()
        if element.kind() == "OptionalType" and element.getElementType().kind() == "TensorType":
            return isinstance(value, t.OptionalTensorList)
        expected = _LISTS.get(element.kind())
        return expected is None or isinstance(value, expected)
    return True  # devices, layouts, memory formats: not read as tagged values


def _check_planned(plan: t.ExecutionPlan) -> None:
    boundary = set(plan.inputs) | set(plan.outputs)
    for index, value in enumerate(plan.values):
        if (
            isinstance(value, t.TensorMeta)
            and index not in boundary
            and value.allocation is None
            and value.data_buffer_idx == 0
            and value.external_key is None
            and value.dynamism != t.DYNAMIC_UNBOUND
        ):
            raise PteFormatError(f"method {plan.name!r}: value {index} is a tensor with neither memory nor data")
