"""The public API: what ``import etmlx`` offers and what it costs, and that the Python
entry points take every option their commands do."""

import argparse
import inspect
import subprocess
import sys

import etmlx
from etmlx.llm.cli import add_commands

from .layout import CHECKOUT

EXPORT_AN_MLP = """
import sys, tempfile, os
import etmlx
assert "torch" not in sys.modules and "transformers" not in sys.modules, "import etmlx imported torch or transformers"
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
x = torch.randn(2, 8)
path = os.path.join(tempfile.mkdtemp(), "mlp.pte")
etmlx.export(model, (x,), path)
torch.testing.assert_close(etmlx.load(path).forward(x), model(x), rtol=1e-5, atol=1e-6)
print("transformers" in sys.modules)
"""


def test_a_plain_export_imports_no_transformers():
    done = subprocess.run([sys.executable, "-c", EXPORT_AN_MLP], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"


def test_entry_points_are_documented_and_take_options_by_keyword():
    for function, positional in ((etmlx.export, ["module", "example_inputs", "path"]),
                                 (etmlx.export_methods, ["methods", "path"]),
                                 (etmlx.export_llm, ["model_dir", "output"]),
                                 (etmlx.load, ["path_or_bytes", "runtime"])):
        assert len(inspect.getdoc(function) or "") > 200, f"{function.__name__} has no docstring"
        parameters = inspect.signature(function).parameters.values()
        assert [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD] == positional, function.__name__


def test_export_llm_takes_every_option_of_its_command():
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    command = parser._subparsers._group_actions[0].choices["export-llm"]
    options = {action.dest for action in command._actions if action.dest not in ("help", "model", "output")}
    assert options <= set(inspect.signature(etmlx.export_llm).parameters), options


def test_etmlx_has_at_most_twelve_top_level_modules():
    """The rest live in subpackages named for their job (llm/, parallel/, quant/)."""
    modules = sorted(path.name for path in (CHECKOUT / "etmlx").glob("*.py"))
    assert len(modules) <= 12, modules
