"""Packages are found, not listed: every folder with an ``__init__.py`` under one of
``PACKAGE_ROOTS`` is a package of the wheel, named by its root's place in the ``etmlx``
namespace (the repository keeps one folder per stage; see docs/architecture.md).
Metadata and dependencies are in pyproject.toml."""

import pathlib

from setuptools import find_packages, setup

# namespace -> folder; tests/test_packaging.py reads this literal
PACKAGE_ROOTS = {
    "etmlx": "etmlx",
    "etmlx.partitioner": "partitioner",
    "etmlx.lowering": "lowering",
    "etmlx.serializer": "serializer",
    "etmlx.runtime_shim": "runtime_shim",
    "etmlx.native": "native",
}

# Files that are not Python but that the installed package needs: the schema, and the
# native backend's sources, which `etmlx build-native` builds from an installed package.
PACKAGE_DATA = {
    "etmlx.serializer": ["schema.fbs"],
    "etmlx.native": ["CMakeLists.txt", "src/*.cpp", "src/*.h", "src/mlx_ops/*.cpp", "src/mlx_ops/*.h",
                     "tools/*.cpp", "tools/*.h", "generated/*.h"],
}


def packages() -> list:
    here = pathlib.Path(__file__).parent
    found = []
    for name, folder in PACKAGE_ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(str(here / folder))]
    return found


setup(packages=packages(), package_dir=PACKAGE_ROOTS, package_data=PACKAGE_DATA)
