"""The etmlx command as a user runs it: export, inspect, run, and one clear line on bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def etmlx(*args):
    return subprocess.run([sys.executable, "-m", "etmlx.cli", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def mlp_pte(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "mlp.pte"
    result = etmlx("export", "examples/models.py:mlp", "-o", str(path), "--report")
    assert result.returncode == 0, result.stderr
    assert "etmlx: all 8 operator calls delegated to MLX" in result.stdout
    assert "aten::addmm" in result.stdout  # the per-operator report
    return path


def test_inspect_json(mlp_pte):
    result = etmlx("inspect", str(mlp_pte), "--json")
    report = json.loads(result.stdout)
    (delegate,) = report["methods"]["forward"]["delegates"]
    assert delegate["backend"] == "EtMlxBackend"
    assert delegate["nodes"] == ["Transpose", "Addmm", "Scalar", "Maximum", "Transpose", "Addmm", "Maximum", "Transpose", "Addmm"]
    assert report["methods"]["forward"]["kernels"] == []


def test_inspect_summarizes_constants_unless_asked(mlp_pte):
    summary = etmlx("inspect", str(mlp_pte)).stdout
    weights = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10  # the MLP's three layers, float32
    assert f"constants: 6, {weights * 4} bytes (--constants lists them)" in summary
    assert "constant float32" not in summary
    listed = etmlx("inspect", str(mlp_pte), "--constants").stdout
    assert listed.count("constant float32") == 6 and "constants: 6" not in listed


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_run_with_inputs_file(mlp_pte, tmp_path, runtime):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, np.zeros((4, 64), np.float32))
    result = etmlx("run", str(mlp_pte), "--inputs", str(inputs), "--iterations", "2", "--runtime", runtime)
    assert result.returncode == 0, result.stderr
    assert "output 0: float32 (4, 10)" in result.stdout and "time per call" in result.stdout
    assert "BLAS:" in result.stdout


def test_run_with_a_named_array(mlp_pte, tmp_path):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.zeros((4, 64), np.float32))
    result = etmlx("run", str(mlp_pte), "--inputs", str(inputs), "--iterations", "1")
    assert result.returncode == 0, result.stderr
    assert "output 0: float32 (4, 10)" in result.stdout


def test_npz_arrays_in_input_order(tmp_path):
    from etmlx.cli import _input_order
    from etmlx.errors import EtMlxError

    positional, named = tmp_path / "positional.npz", tmp_path / "named.npz"
    np.savez(positional, *[np.zeros(1)] * 12)
    np.savez(named, tokens=np.zeros(1), mask=np.zeros(1), positions=np.zeros(1))
    with np.load(positional) as archive:
        assert _input_order(archive.files) == [f"arr_{i}" for i in range(12)]  # arr_10 after arr_9
    with np.load(named) as archive:
        assert _input_order(archive.files) == ["tokens", "mask", "positions"]
    with pytest.raises(EtMlxError, match="name every array or none"):
        _input_order(["mask", "arr_0"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "README.md"], "not an ExecuTorch .pte file"),
        (["export", "examples/models.py", "-o", "x.pte"], "expected FILE.py:FACTORY"),
        (["export", "examples/models.py:missing", "-o", "x.pte"], "has no callable 'missing'"),
        (["export", "examples/models.py:mlp", "-o", "no/such/folder/x.pte"], "no folder"),
    ],
)
def test_bad_input_is_one_clear_line(args, message):
    result = etmlx(*args)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"etmlx {args[0]}: error:") and message in line


@pytest.mark.parametrize("command", [["export-llm", "folder", "-o", "x.pte"], ["chat", "x.pte"]])
def test_language_model_commands_without_transformers_say_what_to_install(command, monkeypatch, capsys):
    """A pip install without the llm extra: one line naming it, not an ImportError's traceback."""
    import importlib.util

    from etmlx.cli import main

    find_spec = importlib.util.find_spec
    missing = lambda name, *args: None if name == "transformers" else find_spec(name, *args)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    assert main(command) == 1
    expected = f"{command[0]} needs transformers, which is not installed: pip install 'etmlx[llm]'"
    assert f"etmlx {command[0]}: error: {expected}" in capsys.readouterr().err


def test_inputs_from_one_npy_and_a_file_that_holds_no_arrays(mlp_pte, tmp_path):
    array = tmp_path / "x.npy"
    np.save(array, np.zeros((4, 64), np.float32))
    assert etmlx("run", str(mlp_pte), "--inputs", str(array), "--iterations", "1").returncode == 0
    for path, message in (("README.md", "README.md is not a NumPy .npz or .npy file of arrays"),
                          (str(tmp_path / "missing.npz"), "missing.npz: no such file")):
        result = etmlx("run", str(mlp_pte), "--inputs", path)
        assert result.returncode == 1
        (line,) = [line for line in result.stderr.splitlines() if line.strip()]
        assert line.startswith("etmlx run: error: --inputs: ") and message in line, line


@pytest.mark.parametrize("command", [["run"], ["generate", "--prompt", "hi"]])
def test_a_program_that_is_not_there_is_one_line_naming_it(tmp_path, command, capsys):
    from etmlx.cli import main

    missing = str(tmp_path / "model.pte")
    assert main([command[0], missing, *command[1:]]) == 1
    assert capsys.readouterr().err == f"etmlx {command[0]}: error: {missing}: No such file or directory\n"


@pytest.mark.parametrize("runtime", ["python", "executorch"])
def test_wrong_input_shape(mlp_pte, tmp_path, runtime):
    inputs = tmp_path / "bad.npz"
    np.savez(inputs, np.zeros((4, 63), np.float32))
    result = etmlx("run", str(mlp_pte), "--inputs", str(inputs), "--runtime", runtime)
    assert result.returncode == 1
    assert "input 0 has shape (4, 63), expected (4, 64)" in result.stderr


def test_export_quantized_to_int4(tmp_path):
    path = tmp_path / "mlp-int4.pte"
    result = etmlx("export", "examples/models.py:mlp", "-o", str(path), "--quantize", "int4", "--group-size", "32")
    assert result.returncode == 0, result.stderr
    assert "quantized to int4: 3 layer(s)" in result.stdout and "3 layer(s) run int4, groups of 32" in result.stdout
    (delegate,) = json.loads(etmlx("inspect", str(path), "--json").stdout)["methods"]["forward"]["delegates"]
    assert delegate["nodes"].count("QuantizedMatmul") == 3
    listed = etmlx("inspect", str(path), "--constants").stdout
    assert "constant uint32" in listed


def test_export_with_a_group_size_mlx_lacks_says_so(tmp_path):
    result = etmlx("export", "examples/models.py:mlp", "-o", str(tmp_path / "x.pte"), "--quantize", "int4",
                   "--group-size", "48")
    assert result.returncode != 0
    assert "group_size=48: MLX takes multiples of 32" in result.stderr
    assert "Traceback" not in result.stderr


def test_ops_lists_the_core_opset_with_the_coverage():
    listed = etmlx("ops")
    assert listed.returncode == 0, listed.stderr
    assert "aten::isnan" in listed.stdout and "core ATen operators" in listed.stdout.splitlines()[-1]
    table = json.loads(etmlx("ops", "--json").stdout)
    rows = {row["operator"]: row for row in table["operators"]}
    assert rows["aten::permute"]["status"] == "delegated"  # as ExecuTorch's permute_copy
    assert rows["aten::slice.Tensor"]["status"] == "checked" and "_check_slice" in rows["aten::slice.Tensor"]["conditions"]
    assert rows["aten::nonzero"]["status"] == "not covered"  # a data-dependent shape
    covered = sum(row["status"] != "not covered" for row in table["operators"])
    assert table["summary"].startswith(f"{covered} of {len(rows)} core ATen operators")


def test_the_command_ends_without_the_teardown_and_loses_no_output(mlp_pte):
    """``etmlx`` ends the process once ``main`` returns (``cli.run``: the interpreter's
    teardown of torch and ExecuTorch takes about a second): what it printed through a pipe,
    block-buffered, still arrives whole, and its exit status is main's."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    shown = subprocess.run([sys.executable, "-m", "etmlx.cli", "inspect", str(mlp_pte)], capture_output=True,
                           text=True, cwd=ROOT, env=env)
    assert shown.returncode == 0 and "constants: 6" in shown.stdout
    failed = subprocess.run([sys.executable, "-m", "etmlx.cli", "run", "README.md"], capture_output=True, text=True,
                            cwd=ROOT, env=env)
    assert failed.returncode == 1 and "not an ExecuTorch .pte file" in failed.stderr
