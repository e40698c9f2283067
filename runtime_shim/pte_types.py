"""Plain-Python records of a decoded ``.pte`` program (see ``decode.py``).

They mirror ``schema/program.fbs`` but hold only what the runtime and ``inspect``
use, with flatbuffer quirks resolved: 64-bit offsets joined, ``IntList`` kept as the
EValue indices it really holds, an empty operator overload spelled ``default``.
Scalar EValues (Int, Double, Bool, String, Null) are plain Python values.
"""

from dataclasses import dataclass, field

STATIC, DYNAMIC_BOUND, DYNAMIC_UNBOUND = 0, 1, 2
DYNAMISM_NAMES = {STATIC: "static", DYNAMIC_BOUND: "dynamic_bound", DYNAMIC_UNBOUND: "dynamic_unbound"}


@dataclass(frozen=True)
class Allocation:
    memory_id: int
    offset: int


@dataclass(frozen=True)
class TensorMeta:
    scalar_type: int
    sizes: tuple  # upper bound when dynamism is DYNAMIC_BOUND
    dim_order: tuple
    dynamism: int
    data_buffer_idx: int  # 0: no serialized data
    allocation: Allocation | None  # None: not memory planned
    mutable_segment: int  # index into Program.mutable_data_segments
    external_key: str | None  # data lives outside the .pte under this name


@dataclass(frozen=True)
class IntList:
    items: tuple  # EValue indices of Int values, not the ints themselves


@dataclass(frozen=True)
class DoubleList:
    items: tuple


@dataclass(frozen=True)
class BoolList:
    items: tuple


@dataclass(frozen=True)
class TensorList:
    items: tuple  # EValue indices


@dataclass(frozen=True)
class OptionalTensorList:
    items: tuple  # EValue indices; -1 is None


@dataclass(frozen=True)
class Operator:
    name: str  # "aten::add"
    overload: str  # "out"; "default" where the file has ""

    @property
    def qualified(self) -> str:
        return f"{self.name}.{self.overload}"


@dataclass(frozen=True)
class KernelCall:
    op_index: int
    args: tuple


@dataclass(frozen=True)
class DelegateCall:
    delegate_index: int
    args: tuple


@dataclass(frozen=True)
class MoveCall:
    move_from: int
    move_to: int


@dataclass(frozen=True)
class JumpFalseCall:
    cond_value_index: int
    destination_instruction: int


@dataclass(frozen=True)
class FreeCall:
    value_index: int


INLINE, SEGMENT = 0, 1


@dataclass(frozen=True)
class BackendDelegate:
    id: str
    location: int  # INLINE: Program.backend_delegate_data, SEGMENT: Program.segments
    index: int
    compile_specs: dict = field(hash=False)  # str -> bytes


@dataclass(frozen=True)
class ExecutionPlan:
    name: str
    values: list
    inputs: tuple
    outputs: tuple
    instructions: list
    operators: list
    delegates: list
    non_const_buffer_sizes: tuple


@dataclass(frozen=True)
class SubsegmentOffsets:
    segment_index: int
    offsets: tuple


@dataclass(frozen=True)
class Segment:
    offset: int  # relative to the segment base offset
    size: int


@dataclass(frozen=True)
class Program:
    version: int
    plans: list
    constant_buffer: list  # deprecated inline constants: numpy uint8 views
    backend_delegate_data: list  # inline delegate payloads: numpy uint8 views
    segments: list
    constant_segment: SubsegmentOffsets | None
    mutable_data_segments: list
    named_data: dict  # key -> segment index
