"""Regenerate the checked-in flatbuffer reader for ExecuTorch's ``program.fbs``.

The code under ``executorch_flatbuffer/`` is produced by the ``flatc`` that ships
with the executorch wheel, from the wheel's own schema, with:

    $EXECUTORCH/data/bin/flatc --python -o OUT \
        $EXECUTORCH/schema/program.fbs $EXECUTORCH/schema/scalar_type.fbs

where ``$EXECUTORCH`` is the installed ``executorch`` package folder. flatc writes
absolute imports (``from executorch_flatbuffer.X import X``); we rewrite them to
relative ones (``from .X import X``) so the package imports as
``etmlx.runtime_shim.generated.executorch_flatbuffer`` without a top-level name.

Run ``python -m etmlx.runtime_shim.generated.regenerate`` to rewrite the files in
place; ``tests/runtime_shim/test_generated.py`` fails when they are stale.
The object API (``--gen-object-api``) is not used: it copies every vector,
including constant tensor data, into Python lists.
"""

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tempfile

PACKAGE = "executorch_flatbuffer"
HERE = pathlib.Path(__file__).resolve().parent


def executorch_dir() -> pathlib.Path:
    """The installed executorch package folder, found without importing it."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("executorch is not installed; it provides flatc and program.fbs")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def generate(out_dir: pathlib.Path) -> pathlib.Path:
    """Run flatc into ``out_dir`` and make the imports relative; returns the package dir."""
    et = executorch_dir()
    subprocess.run(
        [
            str(et / "data" / "bin" / "flatc"),
            "--python",
            "-o",
            str(out_dir),
            str(et / "schema" / "program.fbs"),
            str(et / "schema" / "scalar_type.fbs"),
        ],
        check=True,
    )
    package = out_dir / PACKAGE
    for path in package.glob("*.py"):
        text = path.read_text()
        path.write_text(text.replace(f"from {PACKAGE}.", "from ."))
    return package


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(pathlib.Path(tmp))
        target = HERE / PACKAGE
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(fresh, target)
    print(f"regenerated {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
