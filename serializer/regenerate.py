"""Regenerates the checked-in Python flatbuffer code from ``schema.fbs``.

Uses the ``flatc`` that ships in the executorch wheel, so no compiler is needed.
flatc writes absolute ``etmlx_ir.X`` imports; they are rewritten to live inside
``etmlx.serializer.generated`` so the generated package needs no sys.path tricks.

    python serializer/regenerate.py          # rewrite serializer/generated (works with it missing)
"""

import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

SCHEMA = pathlib.Path(__file__).with_name("schema.fbs")
GENERATED = pathlib.Path(__file__).with_name("generated")
PACKAGE = "etmlx.serializer.generated.etmlx_ir"
HEADER = "# Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.\n"


def flatc_path() -> pathlib.Path:
    import executorch.data.bin as bin_dir  # the wheel's flatc lives beside this module

    return pathlib.Path(bin_dir.__file__).with_name("flatc")


def generate(out_dir: pathlib.Path) -> None:
    """Writes the generated package (``etmlx_ir/`` and ``__init__.py``) into ``out_dir``."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(flatc_path()), "--python", "--gen-object-api", "-o", tmp, str(SCHEMA)],
            check=True,
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "__init__.py").write_text(HEADER)
        target = out_dir / "etmlx_ir"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for source in sorted(pathlib.Path(tmp, "etmlx_ir").glob("*.py")):
            text = re.sub(r"\betmlx_ir\.", PACKAGE + ".", source.read_text())
            (target / source.name).write_text(HEADER + text)


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else GENERATED)
