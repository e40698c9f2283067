"""The checked-in generated code (Python and C++) is what flatc makes of schema.fbs today."""

import filecmp
import pathlib

from etmlx.serializer import regenerate


def test_generated_python_is_current(tmp_path: pathlib.Path):
    regenerate.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py"))
    checked_in = sorted(p.relative_to(regenerate.GENERATED) for p in regenerate.GENERATED.rglob("*.py"))
    assert fresh == checked_in, "run: python serializer/regenerate.py"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, regenerate.GENERATED / p, shallow=False)]
    assert not stale, f"stale generated files {stale}; run: python serializer/regenerate.py"


def test_generated_cpp_is_current(tmp_path: pathlib.Path):
    regenerate.generate_cpp(tmp_path)
    name = regenerate.CPP_NAME
    assert filecmp.cmp(tmp_path / name, regenerate.GENERATED_CPP / name, shallow=False), (
        "stale native/generated/" + name + "; run: python serializer/regenerate.py"
    )
