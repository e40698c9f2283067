"""Decode the program flatbuffer into the records of ``pte_types``, checking indices.

Everything except bulk data (constants, delegate payloads) is copied out of the
flatbuffer here, so a corrupt file fails at load with a ``PteFormatError`` rather
than halfway through a run. Bulk data stays as numpy views over the file bytes.
"""

import struct

import numpy as np

from . import pte_types as t
from .errors import PteFormatError
from .limits import max_arena_bytes
from .generated.executorch_flatbuffer import (
    AllocationDetails,
    Bool,
    BoolList,
    DelegateCall,
    Double,
    DoubleList,
    FreeCall,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    OptionalTensorList,
    String,
    Tensor,
    TensorList,
)
from .generated.executorch_flatbuffer.InstructionArguments import InstructionArguments
from .generated.executorch_flatbuffer.KernelTypes import KernelTypes
from .generated.executorch_flatbuffer.Program import Program

_EXTERNAL = 1  # TensorDataLocation.EXTERNAL


def decode_program(data) -> t.Program:
    """Decode the Program table rooted at the start of ``data`` (a bytearray)."""
    try:
        return _program(Program.GetRootAs(data, 0))
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError) as e:  # flatbuffers' range checks raise TypeError
        if isinstance(e, PteFormatError):
            raise
        raise PteFormatError(f"corrupt or truncated program flatbuffer ({type(e).__name__}: {e})") from e


def _tuple(vector) -> tuple:
    """A flatbuffer ``...AsNumpy()`` result as a tuple of Python ints (absent -> ())."""
    return () if isinstance(vector, int) else tuple(vector.tolist())


def _bytes_view(vector) -> np.ndarray:
    return np.zeros(0, np.uint8) if isinstance(vector, int) else vector


def _str(raw) -> str:
    return "" if raw is None else raw.decode("utf-8")


def _table(cls, union_table):
    obj = cls()
    obj.Init(union_table.Bytes, union_table.Pos)
    return obj


def _program(p) -> t.Program:
    plans = [_plan(p.ExecutionPlan(i)) for i in range(p.ExecutionPlanLength())]
    names = [plan.name for plan in plans]
    if len(set(names)) != len(names):
        raise PteFormatError(f"method names repeat: {names}")
    cs = p.ConstantSegment()
    return t.Program(
        version=p.Version(),
        plans=plans,
        constant_buffer=[_bytes_view(p.ConstantBuffer(i).StorageAsNumpy()) for i in range(p.ConstantBufferLength())],
        backend_delegate_data=[
            _bytes_view(p.BackendDelegateData(i).DataAsNumpy()) for i in range(p.BackendDelegateDataLength())
        ],
        segments=[t.Segment(p.Segments(i).Offset(), p.Segments(i).Size()) for i in range(p.SegmentsLength())],
        constant_segment=None if cs is None else _subsegments(cs),
        mutable_data_segments=[_subsegments(p.MutableDataSegments(i)) for i in range(p.MutableDataSegmentsLength())],
        named_data={_str(p.NamedData(i).Key()): p.NamedData(i).SegmentIndex() for i in range(p.NamedDataLength())},
    )


def _subsegments(s) -> t.SubsegmentOffsets:
    return t.SubsegmentOffsets(s.SegmentIndex(), _tuple(s.OffsetsAsNumpy()))


def _plan(ep) -> t.ExecutionPlan:
    name = _str(ep.Name())
    if not name or not name.isprintable():
        raise PteFormatError(f"method name {name!r} is empty or not printable")
    if ep.ChainsLength() != 1:
        raise PteFormatError(f"method {name!r} has {ep.ChainsLength()} chains; only single-chain plans are supported")
    if ep.InputsIsNone() or ep.OutputsIsNone():  # ExecuTorch's runtime aborts on such a plan
        raise PteFormatError(f"method {name!r}: the plan lacks its list of inputs or outputs")
    chain = ep.Chains(0)
    plan = t.ExecutionPlan(
        name=name,
        values=[_value(ep.Values(i), name, i) for i in range(ep.ValuesLength())],
        inputs=_tuple(ep.InputsAsNumpy()),
        outputs=_tuple(ep.OutputsAsNumpy()),
        instructions=[_instruction(chain.Instructions(i), name, i) for i in range(chain.InstructionsLength())],
        operators=[_operator(ep.Operators(i)) for i in range(ep.OperatorsLength())],
        delegates=[_delegate(ep.Delegates(i)) for i in range(ep.DelegatesLength())],
        non_const_buffer_sizes=_tuple(ep.NonConstBufferSizesAsNumpy()),
    )
    _check_indices(plan)
    _check_sizes(plan)
    return plan


def _operator(op) -> t.Operator:
    return t.Operator(_str(op.Name()), _str(op.Overload()) or "default")


def _delegate(d) -> t.BackendDelegate:
    ref = d.Processed()
    if ref is None:
        raise PteFormatError(f"delegate {_str(d.Id())!r} has no processed data reference")
    specs = {}
    for i in range(d.CompileSpecsLength()):
        spec = d.CompileSpecs(i)
        specs[_str(spec.Key())] = _bytes_view(spec.ValueAsNumpy()).tobytes()
    return t.BackendDelegate(_str(d.Id()), ref.Location(), ref.Index(), specs)


def _value(evalue, plan: str, index: int):
    kind = evalue.ValType()
    val = evalue.Val()
    if kind == KernelTypes.Null:
        return None
    if val is None:
        raise PteFormatError(f"method {plan!r}: value {index} has type {kind} but no payload")
    if kind == KernelTypes.Int:
        return _table(Int.Int, val).IntVal()
    if kind == KernelTypes.Bool:
        return bool(_table(Bool.Bool, val).BoolVal())
    if kind == KernelTypes.Double:
        return float(_table(Double.Double, val).DoubleVal())
    if kind == KernelTypes.String:
        return _str(_table(String.String, val).StringVal())
    if kind == KernelTypes.Tensor:
        return _tensor(_table(Tensor.Tensor, val))
    if kind == KernelTypes.IntList:
        return t.IntList(_tuple(_table(IntList.IntList, val).ItemsAsNumpy()))
    if kind == KernelTypes.DoubleList:
        return t.DoubleList(tuple(float(v) for v in _tuple(_table(DoubleList.DoubleList, val).ItemsAsNumpy())))
    if kind == KernelTypes.BoolList:
        return t.BoolList(tuple(bool(v) for v in _tuple(_table(BoolList.BoolList, val).ItemsAsNumpy())))
    if kind == KernelTypes.TensorList:
        return t.TensorList(_tuple(_table(TensorList.TensorList, val).ItemsAsNumpy()))
    if kind == KernelTypes.OptionalTensorList:
        return t.OptionalTensorList(_tuple(_table(OptionalTensorList.OptionalTensorList, val).ItemsAsNumpy()))
    raise PteFormatError(f"method {plan!r}: value {index} has unknown value type {kind}")


def _tensor(ts) -> t.TensorMeta:
    alloc = ts.AllocationInfo()
    extra = ts.ExtraTensorInfo()
    external = None
    if extra is not None and extra.Location() == _EXTERNAL:
        external = _str(extra.FullyQualifiedName())
    return t.TensorMeta(
        scalar_type=ts.ScalarType(),
        sizes=_tuple(ts.SizesAsNumpy()),
        dim_order=_tuple(ts.DimOrderAsNumpy()),
        dynamism=ts.ShapeDynamism(),
        data_buffer_idx=ts.DataBufferIdx(),
        allocation=None if alloc is None else _allocation(alloc),
        mutable_segment=0 if extra is None else extra.MutableDataSegmentsIdx(),
        external_key=external,
    )


def _allocation(a: AllocationDetails.AllocationDetails) -> t.Allocation:
    return t.Allocation(a.MemoryId(), a.MemoryOffsetLow() | (a.MemoryOffsetHigh() << 32))


def _instruction(instr, plan: str, index: int):
    kind = instr.InstrArgsType()
    val = instr.InstrArgs()
    if val is None:
        raise PteFormatError(f"method {plan!r}: instruction {index} has unknown instruction type {kind}")
    if kind == InstructionArguments.KernelCall:
        k = _table(KernelCall.KernelCall, val)
        return t.KernelCall(k.OpIndex(), _tuple(k.ArgsAsNumpy()))
    if kind == InstructionArguments.DelegateCall:
        d = _table(DelegateCall.DelegateCall, val)
        return t.DelegateCall(d.DelegateIndex(), _tuple(d.ArgsAsNumpy()))
    if kind == InstructionArguments.MoveCall:
        m = _table(MoveCall.MoveCall, val)
        return t.MoveCall(m.MoveFrom(), m.MoveTo())
    if kind == InstructionArguments.JumpFalseCall:
        j = _table(JumpFalseCall.JumpFalseCall, val)
        return t.JumpFalseCall(j.CondValueIndex(), j.DestinationInstruction())
    if kind == InstructionArguments.FreeCall:
        return t.FreeCall(_table(FreeCall.FreeCall, val).ValueIndex())
    raise PteFormatError(f"method {plan!r}: instruction {index} has unknown instruction type {kind}")


def _check_sizes(plan: t.ExecutionPlan) -> None:
    """Planned arenas and tensor shapes within ``limits``, before anything is allocated."""
    limit = max_arena_bytes()
    for memory_id, size in enumerate(plan.non_const_buffer_sizes):
        if not 0 <= size <= limit:
            raise PteFormatError(
                f"method {plan.name!r}: planned memory {memory_id} of {size} bytes is past the limit of "
                f"{limit} (ETMLX_MAX_ARENA_BYTES)"
            )
    for index, value in enumerate(plan.values):
        if isinstance(value, t.TensorMeta) and any(size < 0 for size in value.sizes):
            raise PteFormatError(f"method {plan.name!r}: value {index} has a negative size in {list(value.sizes)}")


def _check_indices(plan: t.ExecutionPlan) -> None:
    """Every index a plan holds points inside the table it indexes."""
    n = len(plan.values)

    def value_index(i: int, where: str, allow_none: bool = False) -> None:
        if not (0 <= i < n or (allow_none and i == -1)):
            raise PteFormatError(f"method {plan.name!r}: {where} refers to value {i}, but there are {n} values")

    for i in plan.inputs:
        value_index(i, "an input")
    for i in plan.outputs:
        value_index(i, "an output")
    for vi, v in enumerate(plan.values):
        if isinstance(v, (t.IntList, t.TensorList, t.OptionalTensorList)):
            for item in v.items:
                value_index(item, f"list value {vi}", allow_none=isinstance(v, t.OptionalTensorList))
    for ii, ins in enumerate(plan.instructions):
        where = f"instruction {ii}"
        if isinstance(ins, (t.KernelCall, t.DelegateCall)):
            for a in ins.args:
                value_index(a, where)
        if isinstance(ins, t.KernelCall) and not 0 <= ins.op_index < len(plan.operators):
            raise PteFormatError(f"method {plan.name!r}: {where} calls operator {ins.op_index} of {len(plan.operators)}")
        if isinstance(ins, t.DelegateCall) and not 0 <= ins.delegate_index < len(plan.delegates):
            raise PteFormatError(
                f"method {plan.name!r}: {where} calls delegate {ins.delegate_index} of {len(plan.delegates)}"
            )
        if isinstance(ins, t.MoveCall):
            value_index(ins.move_from, where)
            value_index(ins.move_to, where)
        if isinstance(ins, t.JumpFalseCall):
            value_index(ins.cond_value_index, where)
            if not 0 <= ins.destination_instruction < len(plan.instructions):
                raise PteFormatError(
                    f"method {plan.name!r}: {where} jumps to instruction {ins.destination_instruction}"
                    f" of {len(plan.instructions)}"
                )
        if isinstance(ins, t.FreeCall):
            value_index(ins.value_index, where)
