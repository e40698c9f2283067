"""Malformed files end in one PteFormatError that names the problem."""

import sys

import flatbuffers
import numpy as np
import pytest
import torch

from etmlx.runtime_shim import PteFormatError, describe, load, read_pte
from etmlx.runtime_shim.generated.executorch_flatbuffer import (
    Chain,
    EValue,
    ExecutionPlan,
    FreeCall,
    Instruction,
    Null,
    Program,
)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def pte(export) -> bytes:
    torch.manual_seed(0)
    return export(Linear(), (torch.randn(2, 4),))


def test_reads_header_segments_and_constants(pte):
    f = read_pte(pte)
    assert f.header is not None and f.header.segment_base_offset > 0
    assert f.program.constant_segment is not None
    plan = f.program.plans[0]
    assert plan.name == "forward" and len(plan.non_const_buffer_sizes) == 2


def test_wrong_identifier():
    with pytest.raises(PteFormatError, match="not an ExecuTorch .pte file"):
        load(b"\x00" * 4 + b"PK\x03\x04" + b"\x00" * 64)


def test_other_schema_version(pte):
    data = bytearray(pte)
    data[4:8] = b"ET13"
    with pytest.raises(PteFormatError, match="unsupported .pte schema version 'ET13'"):
        load(bytes(data))


@pytest.mark.parametrize("keep", [3, 30, 200])
def test_truncated(pte, keep):
    with pytest.raises(PteFormatError, match="truncated"):
        load(pte[:keep])


def test_truncated_segments(pte):
    with pytest.raises(PteFormatError, match="truncated file"):
        load(pte[:-8])


def test_segment_out_of_range(pte):
    data = bytearray(pte)
    data[24:32] = len(data).to_bytes(8, "little")  # segment base offset: end of file
    data[32:40] = (0).to_bytes(8, "little")  # segment data size: "not filled in"
    with pytest.raises(PteFormatError, match="segment 0 .* out of range"):
        load(bytes(data))


def _program(value_type: int = 1, instruction_type: int = 5) -> bytes:
    """A one-method program with one value and one instruction of the given union types."""
    b = flatbuffers.Builder(0)
    Null.Start(b)
    null = Null.End(b)
    EValue.Start(b)
    EValue.AddValType(b, value_type)
    EValue.AddVal(b, null)
    value = EValue.End(b)
    FreeCall.Start(b)
    FreeCall.AddValueIndex(b, 0)
    free = FreeCall.End(b)
    Instruction.Start(b)
    Instruction.AddInstrArgsType(b, instruction_type)
    Instruction.AddInstrArgs(b, free)
    instruction = Instruction.End(b)
    Chain.StartInstructionsVector(b, 1)
    b.PrependUOffsetTRelative(instruction)
    instructions = b.EndVector()
    Chain.Start(b)
    Chain.AddInstructions(b, instructions)
    chain = Chain.End(b)
    ExecutionPlan.StartValuesVector(b, 1)
    b.PrependUOffsetTRelative(value)
    values = b.EndVector()
    ExecutionPlan.StartChainsVector(b, 1)
    b.PrependUOffsetTRelative(chain)
    chains = b.EndVector()
    ExecutionPlan.StartInputsVector(b, 0)  # empty but present, as ExecuTorch writes them
    inputs = b.EndVector()
    ExecutionPlan.StartOutputsVector(b, 0)
    outputs = b.EndVector()
    name = b.CreateString("forward")
    ExecutionPlan.Start(b)
    ExecutionPlan.AddName(b, name)
    ExecutionPlan.AddValues(b, values)
    ExecutionPlan.AddInputs(b, inputs)
    ExecutionPlan.AddOutputs(b, outputs)
    ExecutionPlan.AddChains(b, chains)
    plan = ExecutionPlan.End(b)
    Program.StartExecutionPlanVector(b, 1)
    b.PrependUOffsetTRelative(plan)
    plans = b.EndVector()
    Program.Start(b)
    Program.AddExecutionPlan(b, plans)
    b.Finish(Program.End(b), file_identifier=b"ET12")
    return bytes(b.Output())


def test_generated_accessors_import_inside_the_package():
    """Generated accessors import the table they return when called: that must resolve
    inside etmlx, never to a top-level ``executorch_flatbuffer``."""
    assert Program.Program.GetRootAs(_program(), 0).ExecutionPlan(0).Name() == b"forward"
    assert "executorch_flatbuffer" not in sys.modules


def test_hand_built_program_runs():
    assert load(_program()).forward() == ()


def test_unknown_value_type():
    with pytest.raises(PteFormatError, match="value 0 has unknown value type 42"):
        load(_program(value_type=42))


def test_unknown_instruction_type():
    with pytest.raises(PteFormatError, match="instruction 0 has unknown instruction type 9"):
        load(_program(instruction_type=9))


def test_describe(pte):
    info = describe(pte)
    (method,) = info.methods
    assert method.name == "forward"
    assert [(i.kind, i.dtype, i.sizes, i.dynamism) for i in method.inputs] == [("tensor", "float32", (2, 4), "static")]
    assert method.kernel_calls == ["aten::permute_copy.out", "aten::addmm.out"]
    assert method.delegates == [] and info.named_data == {}
    assert info.as_dict()["methods"][0]["name"] == "forward"


def test_constants_are_read_from_the_constant_segment(pte):
    torch.manual_seed(0)
    model = Linear()
    x = np.random.default_rng(0).standard_normal((2, 4), dtype=np.float32)
    np.testing.assert_allclose(load(pte).forward(x), model(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)
