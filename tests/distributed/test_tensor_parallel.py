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


def _encoder_block_on_two_ranks(tmp_path, block, runtime="python") -> list:
    tokens = torch.randint(0, 256, (2, 16))
    result = etmlx.export(block, (tokens,), tmp_path / "block", tensor_parallel=2)
    np.savez(tmp_path / "inputs.npz", tokens=tokens.numpy())
    done, _ = launch(tmp_path / "block", tmp_path, "forward", runtime)
    with torch.no_grad():
        expected = block(tokens).numpy()
    for rank, outputs in enumerate(rank_outputs(tmp_path)):
        np.testing.assert_allclose(outputs["out0"], expected, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}\n{done.stderr}")
    return result


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_encoder_block_on_two_ranks(tmp_path, runtime):
    result = _encoder_block_on_two_ranks(tmp_path, EncoderBlock().eval(), runtime)
    assert [d.sharded for d in result.decisions] == [True, True]
    # the attention output and the MLP's down projection, each summed across ranks
    assert _nodes(result.ranks[0].path).count("AllSum") == 2
    # each rank holds half of the sharded weights: ~3/4 of the block's 201 KB of float32 is qkv, proj, up, gate, down
    whole = etmlx.export(EncoderBlock().eval(), (torch.randint(0, 256, (2, 16)),), tmp_path / "whole.pte")
    assert result.ranks[0].size_bytes < 0.65 * whole.size_bytes


def test_heads_that_do_not_divide_stay_whole(tmp_path):
    """3 heads over 2 ranks: the attention is replicated, the MLP still sharded."""
    result = _encoder_block_on_two_ranks(tmp_path, EncoderBlock(dim=48, heads=3).eval())
    attention, mlp = result.decisions
    assert not attention.sharded and "3 heads do not split over 2 ranks" in attention.reason
    assert mlp.sharded
    assert _nodes(result.ranks[0].path).count("AllSum") == 1


def test_tiny_llama_prefill_then_decode_on_two_ranks(tmp_path):
    from etmlx import causal_lm

    model = tiny_llama().eval()
    result = etmlx.export_methods(
        lambda m: causal_lm.export_methods(m, max_prompt=8), tmp_path / "llama", tensor_parallel=2, model=model
    )
    assert all(d.sharded for d in result.decisions) and len(result.decisions) == 4  # 2 layers x (attention, MLP)
    assert _nodes(result.ranks[0].path, "decode").count("AllSum") == 4
    prompt, new_tokens = [5, 17, 3, 99, 42], 8
    np.savez(tmp_path / "inputs.npz", prompt=np.array(prompt), new_tokens=np.array(new_tokens), capacity=np.array(MAX_CACHE))
    done, _ = launch(tmp_path / "llama", tmp_path, "generate")
    expected_tokens = eager_greedy(model, prompt, new_tokens)
    with torch.no_grad():  # the logits of every position, from the whole sequence at once
        logits = model(torch.tensor([expected_tokens])).logits[0, len(prompt) - 1:-1].numpy()
    for rank, outputs in enumerate(rank_outputs(tmp_path)):
        assert outputs["tokens"].tolist() == expected_tokens, f"rank {rank}\n{done.stderr}"
        np.testing.assert_allclose(outputs["logits"], logits, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}")


@pytest.fixture(scope="module")
def two_rank_block(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tp") / "block"
    tokens = torch.randint(0, 256, (2, 16))
    etmlx.export(EncoderBlock().eval(), (tokens,), directory, tensor_parallel=2)
    np.savez(directory.parent / "inputs.npz", tokens=tokens.numpy())
    return directory


def test_wrong_world_size_is_one_clear_error(two_rank_block):
    """This test process is a group of one."""
    with pytest.raises(EtMlxError, match=r"exported for 2 ranks, but this process group has 1: start it with `mlx.launch -n 2"):
        etmlx.load(two_rank_block)


def test_a_rank_that_stops_answering_stops_the_others(two_rank_block):
    """Rank 1 sleeps instead of calling: rank 0's sum would wait forever on the ring."""
    done, seconds = launch(two_rank_block, two_rank_block.parent, "stall", env={"ETMLX_DISTRIBUTED_TIMEOUT": "3"})
    assert "rank 0 of 2: method 'forward' did not finish within 3 s" in done.stderr + done.stdout
    assert seconds < 60


def test_a_rank_that_dies_fails_the_others(two_rank_block):
    done, seconds = launch(two_rank_block, two_rank_block.parent, "die")
    assert not os.path.exists(two_rank_block.parent / "rank0.npz")
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


def test_command_line(tmp_path):
    """``etmlx export --tensor-parallel 2``, ``inspect`` of the directory, and ``etmlx run``
    under ``mlx.launch`` (the timing loop included) and outside it (one clear error)."""
    directory = tmp_path / "block"
    cli = [sys.executable, "-m", "etmlx.cli"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    exported = subprocess.run([*cli, "export", "examples/models.py:encoder_block", "-o", str(directory),
                               "--tensor-parallel", "2"], capture_output=True, text=True, cwd=root)
    assert exported.returncode == 0, exported.stderr
    assert "2 ranks" in exported.stdout and "(root) attention: sharded" in exported.stdout
    inspected = subprocess.run([*cli, "inspect", str(directory)], capture_output=True, text=True)
    assert "tensor parallel over 2 ranks" in inspected.stdout and "AllSum" in inspected.stdout
    alone = subprocess.run([*cli, "run", str(directory)], capture_output=True, text=True)
    assert alone.returncode == 1 and "start it with `mlx.launch -n 2" in alone.stderr
    launched = subprocess.run([LAUNCH, "-n", "2", "--backend", "ring", "--python", sys.executable,
                               os.path.join(os.path.dirname(sys.executable), "etmlx"), "run", str(directory),
                               "--iterations", "2"], capture_output=True, text=True, timeout=240)
    assert launched.stdout.count("output 0: float32 (2, 16, 64)") == 2, launched.stdout + launched.stderr
