import pathlib

from etmlx.runtime_shim.generated import regenerate


def test_checked_in_code_matches_flatc(tmp_path):
    fresh = regenerate.generate(tmp_path)
    checked_in = pathlib.Path(regenerate.__file__).parent / regenerate.PACKAGE
    fresh_files = {p.name: p.read_text() for p in fresh.glob("*.py")}
    ours = {p.name: p.read_text() for p in checked_in.glob("*.py")}
    assert fresh_files.keys() == ours.keys(), "run python -m etmlx.runtime_shim.generated.regenerate"
    stale = [name for name in ours if ours[name] != fresh_files[name]]
    assert not stale, f"stale generated files {stale}: run python -m etmlx.runtime_shim.generated.regenerate"
