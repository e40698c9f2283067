"""The wheel and the sdist carry every module of the source tree and everything
`etmlx build-native` needs to build the native backend from an installed package.
(`make test-wheel` installs the wheel into a fresh venv and runs it.)"""

import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from .layout import CHECKOUT, package_roots, source_modules

BUILD = "from setuptools import build_meta; import sys; print(getattr(build_meta, sys.argv[1])(sys.argv[2]))"


def _installed_name(path) -> str:
    """Where a file of the checkout lands in the installed package."""
    relative = path.relative_to(CHECKOUT)
    for namespace, folder in package_roots().items():
        if relative.parts[0] == folder:
            return "/".join([*namespace.split("."), *relative.parts[1:]])
    raise AssertionError(f"{relative} is under no package root")


def expected_files() -> set:
    native = CHECKOUT / "native"
    sources = [p for p in native.rglob("*") if p.suffix in (".cpp", ".h") or p.name == "CMakeLists.txt"]
    schema = CHECKOUT / "serializer" / "schema.fbs"
    return {_installed_name(p) for p in [*source_modules().values(), *sources, schema]}


@pytest.fixture(scope="module")
def distributions(tmp_path_factory):
    """(wheel's files, sdist's files), built with the PEP 517 hooks (no network) from a
    copy of the sources: setuptools keeps what an earlier build left in build/."""
    out, source = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("source") / "etmlx"
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "out"))
    names = {}
    for hook in ("build_wheel", "build_sdist"):
        done = subprocess.run([sys.executable, "-c", BUILD, hook, str(out)], cwd=source, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        names[hook] = out / done.stdout.strip().splitlines()[-1]
    wheel = set(zipfile.ZipFile(names["build_wheel"]).namelist())
    with tarfile.open(names["build_sdist"]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()}
    return wheel, members


def test_wheel_has_every_module_and_the_native_sources(distributions):
    wheel, _ = distributions
    expected = expected_files()
    assert "etmlx/lowering/fusions/fused_calls.py" in expected and "etmlx/native/src/backend.cpp" in expected
    assert expected - wheel == set()


def test_sdist_has_the_same_files(distributions):
    _, sdist = distributions
    checkout_paths = {str(p.relative_to(CHECKOUT)) for p in (CHECKOUT / "native").rglob("*") if p.is_file() and p.suffix in (".cpp", ".h")}
    assert {"setup.py", "pyproject.toml", "native/CMakeLists.txt"} <= sdist
    assert checkout_paths - sdist == set()
    assert {str(p.relative_to(CHECKOUT)) for p in source_modules().values()} - sdist == set()
