"""Resource limits: a file cannot make either runtime allocate without bound. Each limit
is an environment variable, read when a runtime starts, so each case runs in a fresh
process."""

import subprocess
import sys

import pytest
import torch

import etmlx

RUNTIMES = etmlx.RUNTIMES


class Grows(torch.nn.Module):
    """A small input, broadcast into a large array."""

    def forward(self, x):
        return x.expand(512, 512, 64) + 1


@pytest.fixture(scope="module")
def grows(tmp_path_factory):
    path = tmp_path_factory.mktemp("limits") / "grows.pte"
    etmlx.export(Grows(), (torch.randn(64),), path)
    return path


def _run(path, runtime, env):
    code = f"""
import etmlx, numpy as np
try:
    etmlx.load({str(path)!r}, runtime={runtime!r}).forward(np.ones(64, np.float32))
    print("ran")
except Exception as error:
    print(type(error).__name__, error)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_array_past_the_limit(grows, runtime, monkeypatch):
    import os

    env = dict(os.environ, ETMLX_MAX_ARRAY_BYTES=str(1 << 20))
    line = _run(grows, runtime, env)
    assert line.startswith("ExecutionError") and "past the limit of 1048576" in line, line
    assert _run(grows, runtime, dict(os.environ)) == "ran"  # 64 MiB is within the default


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_arena_past_the_limit(tmp_path, runtime):
    import os

    from examples import models

    module, inputs, _ = models.encoder_block()
    path = tmp_path / "block.pte"
    etmlx.export(module, inputs, path)
    line = _run(path, runtime, dict(os.environ, ETMLX_MAX_ARENA_BYTES="1000"))
    assert line.startswith("PteFormatError") and "past the limit of 1000 (ETMLX_MAX_ARENA_BYTES)" in line, line


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_limit_that_is_no_number_is_named(grows, runtime):
    import os

    line = _run(grows, runtime, dict(os.environ, ETMLX_MAX_ARRAY_BYTES="16G"))  # import etmlx still works
    assert line.startswith("ExecutionError") and "ETMLX_MAX_ARRAY_BYTES must be a number of bytes, not '16G'" in line


LIMIT_TEXTS = ["0", "1048576", "17179869184", "9223372036854775807", "9223372036854775808", "99999999999999999999",
               "-1", "+5", " 5", "5 ", "", "1_000", "16G", "0x10", "١٢"]


def test_both_runtimes_read_a_limit_alike():
    """One answer per string from each runtime's parser (the native one through its C
    interface): a number of bytes, or refused."""
    import etmlx.native
    from etmlx.runtime_shim.limits import parse_byte_count

    python = {text: parse_byte_count(text) for text in LIMIT_TEXTS}
    native = {text: etmlx.native.library.parse_byte_count(text) for text in LIMIT_TEXTS}
    assert python == native
    assert python["17179869184"] == 16 << 30 and python["9223372036854775808"] is None
    assert [text for text, value in python.items() if value is not None] == LIMIT_TEXTS[:4]
