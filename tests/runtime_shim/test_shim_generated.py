import importlib
import pathlib
import sys

from etmlx.runtime_shim.generated import regenerate


def test_checked_in_code_matches_flatc(tmp_path):
    fresh = regenerate.generate(tmp_path)
    checked_in = pathlib.Path(regenerate.__file__).parent / regenerate.PACKAGE
    fresh_files = {p.name: p.read_text() for p in fresh.glob("*.py")}
    ours = {p.name: p.read_text() for p in checked_in.glob("*.py")}
    assert fresh_files.keys() == ours.keys(), "run python -m etmlx.runtime_shim.generated.regenerate"
    stale = [name for name in ours if ours[name] != fresh_files[name]]
    assert not stale, f"stale generated files {stale}: run python -m etmlx.runtime_shim.generated.regenerate"


def test_generated_code_imports_inside_the_package():
    """Generated accessors import the table they return when called: reading a plan
    through them must resolve inside etmlx, never a top-level ``executorch_flatbuffer``."""
    import flatbuffers

    package = "etmlx.runtime_shim.generated.executorch_flatbuffer"
    program_module = importlib.import_module(f"{package}.Program")
    plan_module = importlib.import_module(f"{package}.ExecutionPlan")
    builder = flatbuffers.Builder(64)
    name = builder.CreateString("forward")
    plan_module.ExecutionPlanStart(builder)
    plan_module.ExecutionPlanAddName(builder, name)
    plan = plan_module.ExecutionPlanEnd(builder)
    program_module.ProgramStartExecutionPlanVector(builder, 1)
    builder.PrependUOffsetTRelative(plan)
    plans = builder.EndVector()
    program_module.ProgramStart(builder)
    program_module.ProgramAddExecutionPlan(builder, plans)
    builder.Finish(program_module.ProgramEnd(builder))
    program = program_module.Program.GetRootAs(builder.Output(), 0)
    assert program.ExecutionPlan(0).Name() == b"forward"  # runs the accessor's lazy import
    assert "executorch_flatbuffer" not in sys.modules
