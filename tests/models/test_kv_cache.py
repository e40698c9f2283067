"""Generation with a KV cache held inside the MLX delegate, carried across the calls of
``forward`` (``etmlx.llm.causal_lm``: prefill chunks and decode steps alike)."""

import pytest
import runtimes
from lowering_harness import WINDOW_READ, tensor_kernels
import torch

import etmlx
from examples import llm

PROMPT = [5, 17, 42, 8, 99, 3]


def prefill(program, prompt):
    return program.forward(torch.tensor([prompt]), torch.arange(len(prompt)))


def decode(program, token, position):
    return program.forward(torch.tensor([[token]]), torch.tensor([position]))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = llm.tiny_llama()
    path = tmp_path_factory.mktemp("llm") / "tiny_llama.pte"
    result = etmlx.export_methods(llm.export_methods(model), path)
    return model, path, result


def test_one_method_whole_on_mlx_with_the_cache_inside(exported):
    from etmlx.inspection import inspect_program

    _, path, result = exported
    assert result.report.fully_delegated
    methods = inspect_program(path)["methods"]
    assert set(methods) == {"forward", *llm.causal_lm.RUNNER_METHODS}
    (delegate,) = methods["forward"]["delegates"]
    assert tensor_kernels(methods["forward"]["kernels"]) == WINDOW_READ
    assert len(delegate["buffers"]) >= 4  # key and value cache of both layers
    assert "IndexPut" in delegate["nodes"] and "Sdpa" in delegate["nodes"]
    assert delegate["nodes"].count("Rope") == 2 * 2  # q and k of both layers, fused


def test_decode_runs_compiled_on_the_direct_path(exported):
    """The window's host read runs before the delegate on the arrays themselves (no
    planned memory), and the delegate, which takes the window as an integer, is compiled
    once for its value rather than interpreted node by node."""
    _, path, _ = exported
    program = etmlx.load(path)
    assert program._direct["forward"] is not None
    for position in range(len(PROMPT), len(PROMPT) + 5):
        decode(program, 7, position)
    (handle,) = program._methods["forward"]._delegates
    assert len(handle._compiled) == 1  # one bucket: the whole 64-slot cache, one token


def test_greedy_tokens_equal_eager(exported):
    model, path, _ = exported
    tokens = llm.greedy(runtimes.load(path), PROMPT, 32)
    assert tokens == llm.eager_greedy(model, PROMPT, 32)


def test_two_loads_keep_separate_caches(exported):
    _, path, _ = exported
    first, second = runtimes.load(path), runtimes.load(path)
    fresh = prefill(second, PROMPT)
    # Fill the first program's cache with another prompt, then decode on the second:
    prefill(first, [1, 2, 3, 4])
    after_other = decode(second, 7, len(PROMPT))
    reference = runtimes.load(path)
    prefill(reference, PROMPT)
    expected = decode(reference, 7, len(PROMPT))
    torch.testing.assert_close(after_other, expected)
    assert fresh.shape == (1, 128)  # the last position's logits


def test_decode_reads_what_prefill_wrote(exported):
    """Decoding after a prefill differs from decoding on an empty cache."""
    _, path, _ = exported
    with_history = runtimes.load(path)
    prefill(with_history, PROMPT)
    assert not torch.allclose(decode(with_history, 7, len(PROMPT)), decode(runtimes.load(path), 7, len(PROMPT)))


def test_generation_runs_without_torch(exported):
    """The runtime and etmlx.llm.generation need mlx, flatbuffers and numpy alone for a
    fully delegated program."""
    import subprocess
    import sys

    _, path, _ = exported
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "executorch", "transformers"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import numpy as np, etmlx
from etmlx.llm import generation
program = etmlx.load({str(path)!r})
tokens = list(generation.generate_tokens(generation.Session(program), [1, 2, 3], 4, stop_at_eos=False))
print(program.forward(np.array([[4]]), np.array([7])).shape, len(tokens), "torch" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["(1,", "128)", "4", "False"]


@pytest.mark.parametrize(
    "step, match",
    [
        ((128, 6), r"^forward: input 'tokens' holds index 128, out of range for a dimension of size 128"),
        ((7, 64), r"^forward: input 'cache_position' holds index 64, out of range for a dimension of size 64"),
    ],
)
def test_out_of_range_token_or_position_raises_and_keeps_the_cache(exported, step, match):
    """A bad token id or cache position is an IndexError, as in PyTorch, and the cache
    is as it was: the next good step gives the logits of a run without the bad one."""
    from etmlx.runtime_shim.errors import IndexRangeError

    _, path, _ = exported
    program, reference = runtimes.load(path), runtimes.load(path)
    for p in (program, reference):
        prefill(p, PROMPT)
    token, position = step
    with pytest.raises(IndexRangeError, match=match):
        decode(program, token, position)
    torch.testing.assert_close(decode(program, 7, len(PROMPT)), decode(reference, 7, len(PROMPT)), rtol=0, atol=0)
