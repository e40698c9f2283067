"""The package as setup.py lays it out: its namespace roots and every module of the
source tree under them, read from the files (nothing imported)."""

import ast
import pathlib

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


def package_roots() -> dict:
    """setup.py's ``PACKAGE_ROOTS`` literal: namespace -> folder."""
    tree = ast.parse((CHECKOUT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["PACKAGE_ROOTS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no PACKAGE_ROOTS")


def source_modules() -> dict:
    """Dotted module name -> source file, for every .py under a root's package folders
    (folders holding an __init__.py, as setup.py finds them)."""
    modules = {}
    for namespace, folder in package_roots().items():
        root = CHECKOUT / folder
        for path in root.rglob("*.py"):
            if not (path.parent / "__init__.py").exists() or not _is_package_folder(root, path.parent):
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([namespace, *parts])] = path
    return modules


def _is_package_folder(root: pathlib.Path, folder: pathlib.Path) -> bool:
    """Every folder from the root down to ``folder`` has an __init__.py."""
    while folder != root:
        if not (folder / "__init__.py").exists():
            return False
        folder = folder.parent
    return True
