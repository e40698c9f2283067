"""A language model's KV cache holds what its calls have written, not its capacity: the
cache buffers grow along the sequence axis in windows (IR ``grow_axis``), on both
runtimes, and the logits stay those of eager PyTorch across every growth step."""

import json
import pathlib
import subprocess
import sys

import pytest
import runtimes
import torch

import etmlx
from etmlx.inspection import inspect_program
from etmlx.runtime_shim.errors import IndexRangeError
from examples import llm
from windowing import assert_steps_match

BENCH_LOAD = pathlib.Path(__file__).parents[2] / "bench" / "bench_load.py"
MIB = 2**20
STEP = 8  # window step of the small export: its cache grows every 8 positions
TOKENS = [(7 * i + 3) % 128 for i in range(60)]


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """tiny_llama (a 64-slot cache) exported with windows of 8 slots, and eager logits."""
    model = llm.tiny_llama()
    path = tmp_path_factory.mktemp("grow") / "stepped.pte"
    etmlx.export_methods(llm.export_methods(model, max_seq_len=16, window_step=STEP), path)
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0]
    return path, logits


def test_every_cache_buffer_grows_along_the_sequence_axis(stepped):
    path, _ = stepped
    report = inspect_program(path)
    (delegate,) = report["methods"]["forward"]["delegates"]
    caches = [b for b in delegate["buffers"] if "key_cache" in b["name"] or "value_cache" in b["name"]]
    assert len(caches) == 4 and all(b["grows_along"] == 2 and b["key"] == "" for b in caches)
    others = [b for b in delegate["buffers"] if b not in caches]
    assert others and all(b["grows_along"] is None for b in others)  # cumulative_length: a scalar, held whole
    capacity = sum(b["bytes"] for b in caches)
    assert report["held_bytes"]["growing_buffers"] == capacity == 4 * 2 * llm.MAX_CACHE * 16 * 4
    assert report["held_bytes"]["buffers"] < capacity  # no zeros held (nor stored) for the caches


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_logits_equal_eager_across_every_growth_step(stepped, runtime):
    """A prefill chunk that straddles a window boundary (13 tokens: slots 0-15), then
    decode steps through six more windows."""
    path, expected = stepped
    program = etmlx.load(path, runtime=runtime)
    assert_steps_match(program, TOKENS, expected, prefill=13)
    if runtime == "python":
        held = {name: value.shape for name, value in program.state._values.items() if "key_cache" in name}
        assert set(held.values()) == {(1, 2, 64 - (63 - 59) // STEP * STEP, 16)}  # 64 slots: position 59's window


def test_a_shorter_conversation_after_a_long_one_reads_its_own_slots(stepped):
    """After growth, a new conversation from position 0 runs with a cache held longer
    than its window (the slots past it hold the old conversation): still eager's."""
    path, expected = stepped
    program = runtimes.load(path)
    program.forward(torch.tensor([[5] * 16]), torch.arange(16))
    program.forward(torch.tensor([[9] * 16]), torch.arange(16, 32))
    again = program.forward(torch.tensor([TOKENS[:6]]), torch.arange(6))
    torch.testing.assert_close(torch.as_tensor(again)[0], expected[5], rtol=1e-4, atol=1e-5)


def test_a_write_past_the_window_is_refused_changing_nothing(stepped):
    """Positions out of order whose writes would pass the window (the cache is written
    from the first position on): IndexRangeError, not a write into a slot not held."""
    path, expected = stepped
    program = runtimes.load(path)
    with pytest.raises(IndexRangeError, match="index 8, out of range for a dimension of size 8"):
        program.forward(torch.tensor([[1, 2, 3]]), torch.tensor([6, 7, 0]))
    first = program.forward(torch.tensor([TOKENS[:13]]), torch.arange(13))
    torch.testing.assert_close(torch.as_tensor(first)[0], expected[12], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def long_and_short(tmp_path_factory):
    """One model exported for a 32768-token and a 512-token context: at capacity their
    caches take 128 MiB and 2 MiB (2 layers of 2 kv heads of 128, fp32)."""
    model = llm.tiny_llama(hidden=512, layers=2, max_cache=512)
    directory = tmp_path_factory.mktemp("contexts")
    paths = {}
    for capacity in (32768, 512):
        paths[capacity] = directory / f"context{capacity}.pte"
        etmlx.export_methods(llm.export_methods(model, max_context_len=capacity), paths[capacity])
    return paths


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_a_long_context_holding_40_tokens_costs_what_a_short_one_does(long_and_short, runtime):
    """Peak resident memory of a fresh process that loads the file and prefills 40
    tokens: the 32k-context export within 48 MiB of the 512-context one (a whole
    32k cache would be 126 MiB more)."""
    assert inspect_program(long_and_short[32768])["held_bytes"]["growing_buffers"] == 128 * MIB
    peaks = {}
    for capacity, path in long_and_short.items():
        child = subprocess.run([sys.executable, str(BENCH_LOAD), "--child", runtime, str(path), "--held", "40"],
                               capture_output=True, text=True, check=True)
        peaks[capacity] = json.loads(child.stdout.strip().splitlines()[-1])["held_peak"]
    assert peaks[32768] - peaks[512] < 48 * MIB, {c: p / MIB for c, p in peaks.items()}
