"""Tensor parallelism over MLX's distributed layer: programs exported with
``tensor_parallel=2`` run as two ranks of ``mlx.launch --backend ring`` on this machine
(loopback), each rank's outputs compared with eager PyTorch."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import etmlx
from etmlx.errors import EtMlxError
from etmlx.inspection import inspect_program
from examples.llm import MAX_CACHE, eager_greedy, tiny_llama
from examples.models import EncoderBlock

RANK_MAIN = os.path.join(os.path.dirname(__file__), "rank_main.py")
LAUNCH = os.path.join(os.path.dirname(sys.executable), "mlx.launch")


def launch(directory, out, mode, runtime="python", ranks=2, env=None, timeout=240):
    """Runs ``rank_main.py`` on ``ranks`` processes; returns (completed process, seconds)."""
    command = [LAUNCH, "-n", str(ranks), "--backend", "ring", "--python", sys.executable,
               RANK_MAIN, str(directory), runtime, str(out), mode]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return done, time.monotonic() - start


def rank_outputs(out, ranks=2) -> list:
    missing = [r for r in range(ranks) if not os.path.exists(out / f"rank{r}.npz")]
    assert not missing, f"ranks {missing} wrote nothing"
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(ranks)]


def _nodes(pte_path, method="forward") -> list:
    info = inspect_program(open(pte_path, "rb").read())["methods"][method]
    assert info["kernels"] == [], f"left outside MLX: {info['kernels']}"
    return [n for d in info["delegates"] for n in d.get("nodes", [])]


def _check_ranks(out, expected: np.ndarray, done) -> None:
    for rank, outputs in enumerate(rank_outputs(out)):
        np.testing.assert_allclose(outputs["out0"], expected, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}\n{done.stderr}")


@pytest.fixture(scope="module")
def two_rank_block(tmp_path_factory):
    """The example encoder block exported for 2 ranks, with ``inputs.npz`` beside its
    directory; returns (directory, export result, eager's output, the block)."""
    directory = tmp_path_factory.mktemp("tp") / "block"
    block, tokens = EncoderBlock().eval(), torch.randint(0, 256, (2, 16))
    result = etmlx.export(block, (tokens,), directory, tensor_parallel=2)
    np.savez(directory.parent / "inputs.npz", tokens=tokens.numpy())
    with torch.no_grad():
        return directory, result, block(tokens).numpy(), block


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_encoder_block_on_two_ranks(two_rank_block, runtime, tmp_path):
    directory, result, expected, block = two_rank_block
    os.link(directory.parent / "inputs.npz", tmp_path / "inputs.npz")
    done, _ = launch(directory, tmp_path, "forward", runtime)
    _check_ranks(tmp_path, expected, done)
    assert [d.sharded for d in result.decisions] == [True, True]
    # the attention output and the MLP's down projection, each summed across ranks
    assert _nodes(result.ranks[0].path).count("AllSum") == 2
    # a rank holds half of qkv, proj, up, gate and down (3/4 of the weights) and all of the rest
    weights = sum(p.numel() * p.element_size() for p in block.parameters())
    assert result.ranks[0].size_bytes < 0.66 * weights


def test_heads_that_do_not_divide_stay_whole(tmp_path):
    """3 heads over 2 ranks: the attention is replicated, the MLP still sharded."""
    block, tokens = EncoderBlock(dim=48, heads=3).eval(), torch.randint(0, 256, (2, 16))
    result = etmlx.export(block, (tokens,), tmp_path / "block", tensor_parallel=2)
    attention, mlp = result.decisions
    assert not attention.sharded and "3 heads do not split over 2 ranks" in attention.reason
    assert mlp.sharded
    assert _nodes(result.ranks[0].path).count("AllSum") == 1
    np.savez(tmp_path / "inputs.npz", tokens=tokens.numpy())
    done, _ = launch(tmp_path / "block", tmp_path, "forward")
    with torch.no_grad():
        _check_ranks(tmp_path, block(tokens).numpy(), done)


@pytest.fixture(scope="module")
def two_rank_llama(tmp_path_factory):
    from etmlx import causal_lm

    model = tiny_llama().eval()
    directory = tmp_path_factory.mktemp("tp") / "llama"
    result = etmlx.export_methods(
        lambda m: causal_lm.export_methods(m, max_prompt=8), directory, tensor_parallel=2, model=model
    )
    return result, model


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_tiny_llama_prefill_then_decode_on_two_ranks(two_rank_llama, runtime, tmp_path):
    result, model = two_rank_llama
    assert all(d.sharded for d in result.decisions) and len(result.decisions) == 4  # 2 layers x (attention, MLP)
    assert _nodes(result.ranks[0].path, "decode").count("AllSum") == 4
    prompt, new_tokens = [5, 17, 3, 99, 42], 8
    np.savez(tmp_path / "inputs.npz", prompt=np.array(prompt), new_tokens=np.array(new_tokens), capacity=np.array(MAX_CACHE))
    done, _ = launch(result.path, tmp_path, "generate", runtime)
    expected_tokens = eager_greedy(model, prompt, new_tokens)
    with torch.no_grad():  # the logits of every position, from the whole sequence at once
        logits = model(torch.tensor([expected_tokens])).logits[0, len(prompt) - 1:-1].numpy()
    for rank, outputs in enumerate(rank_outputs(tmp_path)):
        assert outputs["tokens"].tolist() == expected_tokens, f"rank {rank}\n{done.stderr}"
        np.testing.assert_allclose(outputs["logits"], logits, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}")


def test_wrong_world_size_is_one_clear_error(two_rank_block):
    """This test process is a group of one."""
    with pytest.raises(EtMlxError, match=r"exported for 2 ranks, but this process group has 1: start it with `mlx.launch -n 2"):
        etmlx.load(two_rank_block[0])


def test_a_rank_that_stops_answering_stops_the_others(two_rank_block):
    """Rank 1 sleeps instead of calling: rank 0's sum would wait forever on the ring."""
    directory = two_rank_block[0]
    done, seconds = launch(directory, directory.parent, "stall", env={"ETMLX_DISTRIBUTED_TIMEOUT": "3"})
    assert "rank 0 of 2: method 'forward' did not finish within 3 s" in done.stderr + done.stdout
    assert seconds < 60


def test_a_rank_that_dies_fails_the_others(two_rank_block):
    directory = two_rank_block[0]
    done, seconds = launch(directory, directory.parent, "die")
    assert "connection to a peer was lost" in done.stderr + done.stdout or "exited with code" in done.stderr + done.stdout
    assert not os.path.exists(directory.parent / "rank0.npz")
    assert seconds < 60


def test_tensor_parallel_arguments_are_checked(tmp_path):
    block, tokens = EncoderBlock().eval(), (torch.randint(0, 256, (2, 16)),)
    with pytest.raises(etmlx.ExportError, match="tensor_parallel=0"):
        etmlx.export(block, tokens, tmp_path / "zero", tensor_parallel=0)
    with pytest.raises(etmlx.ExportError, match="quantize= with tensor_parallel="):
        etmlx.export(block, tokens, tmp_path / "quantized", tensor_parallel=2, quantize="int4")
    with pytest.raises(etmlx.ExportError, match=r"nothing of EncoderBlock splits over 2 ranks \(\(root\) attention: replicated "
                       r"\(3 heads do not split over 2 ranks\); \(root\) mlp: replicated \(hidden size 147"):
        odd = EncoderBlock(dim=48, heads=3)
        odd.up, odd.gate, odd.down = torch.nn.Linear(48, 147), torch.nn.Linear(48, 147), torch.nn.Linear(147, 48)
        etmlx.export(odd.eval(), tokens, tmp_path / "odd", tensor_parallel=2)


def test_command_line(tmp_path, capsys):
    """``etmlx export --tensor-parallel 2``, ``inspect`` of the directory, and ``etmlx run``
    outside ``mlx.launch`` (one clear error; under it, run loads the rank as above)."""
    from etmlx.cli import main

    directory = str(tmp_path / "block")
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
    assert main(["export", os.path.join(examples, "models.py:encoder_block"), "-o", directory, "--tensor-parallel", "2"]) == 0
    assert main(["inspect", directory]) == 0
    assert main(["run", directory]) == 1
    out, err = capsys.readouterr()
    assert "2 ranks" in out and "(root) attention: sharded" in out
    assert "tensor parallel over 2 ranks" in out and "AllSum" in out
    assert "etmlx run: error:" in err and "start it with `mlx.launch -n 2" in err
