"""A plain-Python summary of a ``.pte`` for ``etmlx inspect``: methods, I/O, calls."""

from dataclasses import asdict, dataclass

from . import pte_types as t
from .dtypes import from_scalar_type
from .errors import PteFormatError
from .pte_file import PteFile, read_pte


@dataclass(frozen=True)
class ValueInfo:
    kind: str  # "tensor", "int", "float", "bool", "str", "none", or a list kind
    dtype: str | None = None  # tensors: torch spelling ("float32")
    sizes: tuple | None = None  # tensors: upper bounds when dynamism is not "static"
    dynamism: str | None = None  # tensors: "static", "dynamic_bound", "dynamic_unbound"
    value: object = None  # non-tensors: the serialized value


@dataclass(frozen=True)
class DelegateInfo:
    backend_id: str
    processed_size: int
    compile_specs: tuple  # keys


@dataclass(frozen=True)
class MethodInfo:
    name: str
    inputs: list
    outputs: list
    delegates: list
    kernel_calls: list  # "aten::add.out", one per KernelCall, in execution order
    instruction_count: int


@dataclass(frozen=True)
class ProgramInfo:
    version: int
    file_size: int
    methods: list
    named_data: dict  # key -> byte size; shared by all methods
    segment_count: int

    def as_dict(self) -> dict:
        return asdict(self)


def _value_info(value) -> ValueInfo:
    if isinstance(value, t.TensorMeta):
        try:
            dtype = from_scalar_type(value.scalar_type).name
        except PteFormatError:
            dtype = f"scalar_type {value.scalar_type}"
        return ValueInfo("tensor", dtype, value.sizes, t.DYNAMISM_NAMES.get(value.dynamism, str(value.dynamism)))
    if value is None:
        return ValueInfo("none")
    if isinstance(value, (bool, int, float, str)):
        return ValueInfo(type(value).__name__, value=value)
    return ValueInfo(type(value).__name__, value=value.items)


def _method_info(pte: PteFile, plan: t.ExecutionPlan) -> MethodInfo:
    return MethodInfo(
        name=plan.name,
        inputs=[_value_info(plan.values[i]) for i in plan.inputs],
        outputs=[_value_info(plan.values[i]) for i in plan.outputs],
        delegates=[
            DelegateInfo(d.id, len(pte.delegate_data(d)), tuple(d.compile_specs)) for d in plan.delegates
        ],
        kernel_calls=[
            plan.operators[ins.op_index].qualified for ins in plan.instructions if isinstance(ins, t.KernelCall)
        ],
        instruction_count=len(plan.instructions),
    )


def describe(pte_or_path) -> ProgramInfo:
    """Summarize a parsed PteFile, or a path / bytes to parse."""
    pte = pte_or_path if isinstance(pte_or_path, PteFile) else read_pte(pte_or_path)
    return ProgramInfo(
        version=pte.program.version,
        file_size=len(pte.data),
        methods=[_method_info(pte, plan) for plan in pte.program.plans],
        named_data={key: len(pte.named_data.get(key)) for key in pte.named_data.keys()},
        segment_count=len(pte.program.segments),
    )
