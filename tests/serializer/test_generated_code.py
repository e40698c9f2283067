"""The checked-in generated code is what serializer/regenerate.py makes of schema.fbs and
constants.py today: flatc's Python and C++, each runtime's MLX-function tables, and the
native backend's constants."""

import filecmp
import pathlib

import pytest

from etmlx.serializer import regenerate

STALE = "; run: python serializer/regenerate.py"


def test_generated_python_is_current(tmp_path: pathlib.Path):
    regenerate.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py"))
    checked_in = sorted(p.relative_to(regenerate.GENERATED) for p in regenerate.GENERATED.rglob("*.py"))
    assert fresh == checked_in, STALE
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, regenerate.GENERATED / p, shallow=False)]
    assert not stale, f"stale generated files {stale}{STALE}"


@pytest.mark.parametrize("generate, name", [
    (regenerate.generate_cpp, regenerate.CPP_NAME),
    (regenerate.generate_cpp_functions, regenerate.CPP_FUNCTIONS_NAME),
    (regenerate.generate_cpp_constants, regenerate.CPP_CONSTANTS_NAME),
])
def test_generated_cpp_is_current(tmp_path: pathlib.Path, generate, name):
    generate(tmp_path)
    assert filecmp.cmp(tmp_path / name, regenerate.GENERATED_CPP / name, shallow=False), f"stale native/generated/{name}{STALE}"


def test_generated_mlx_functions_are_current(tmp_path: pathlib.Path):
    regenerate.generate_functions(tmp_path / "mlx_functions.py")
    assert filecmp.cmp(tmp_path / "mlx_functions.py", regenerate.GENERATED_FUNCTIONS, shallow=False), (
        f"stale {regenerate.GENERATED_FUNCTIONS.name}{STALE}"
    )


def test_every_member_of_a_function_table_names_its_mlx_function():
    tables = regenerate.mlx_functions()
    assert tables["UnaryOp"][0] == ("Neg", "negative") and ("GeluTanh", "nn.gelu_approx") in tables["UnaryOp"]
    assert [len(tables[e]) for e in ("BinaryOp", "ReduceOp", "ArgReduceOp", "ScanOp")] == [21, 7, 2, 1]
