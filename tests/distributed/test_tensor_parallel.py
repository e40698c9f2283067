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
from lowering_harness import WINDOW_READ, tensor_kernels

import etmlx
from etmlx.parallel import ranks as tensor_parallel
from etmlx.errors import EtMlxError
from etmlx.inspection import inspect_program
from examples.llm import eager_greedy, tiny_llama
from etmlx.quant.weights import quantized_copy
from examples.models import EncoderBlock

RANK_MAIN = os.path.join(os.path.dirname(__file__), "rank_main.py")
LAUNCH = os.path.join(os.path.dirname(sys.executable), "mlx.launch")


def launch(out, *jobs, runtime="python", ranks=2, env=None, timeout=300):
    """Runs ``rank_main.py`` on ``ranks`` processes, each running the ``jobs``
    (``NAME:MODE:DIRECTORY``) in order; returns (completed process, seconds)."""
    command = [LAUNCH, "-n", str(ranks), "--backend", "ring", "--python", sys.executable, RANK_MAIN, runtime, str(out), *jobs]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return done, time.monotonic() - start


def rank_outputs(out, name, done, ranks=2) -> list:
    missing = [r for r in range(ranks) if not os.path.exists(out / f"{name}.rank{r}.npz")]
    assert not missing, f"{name}: ranks {missing} wrote nothing\n{done.stdout}\n{done.stderr}"
    return [dict(np.load(out / f"{name}.rank{r}.npz")) for r in range(ranks)]


def _nodes(pte_path, method="forward", kernels=()) -> list:
    info = inspect_program(open(pte_path, "rb").read())["methods"][method]
    assert tensor_kernels(info["kernels"]) == list(kernels), f"left outside MLX: {info['kernels']}"
    return [n for d in info["delegates"] for n in d.get("nodes", [])]


class QkvoBlock(torch.nn.Module):
    """Attention through SDPA with projections named q/k/v/o, grouped-query (4 query and
    2 key/value heads), and an MLP named fc1/fc2: no name sharding ever looked for."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.n_heads, self.head_dim = heads, dim // heads
        self.q, self.o = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)
        self.k, self.v = torch.nn.Linear(dim, kv_heads * self.head_dim), torch.nn.Linear(dim, kv_heads * self.head_dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = (p(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class NanoGptBlock(torch.nn.Module):
    """nanoGPT's block: the stacked projection split by ``self.n_embd`` and each part
    viewed with ``self.n_head`` against the input's width, which no shard of the heads
    can follow; its attention stays whole on every rank and its MLP splits."""

    def __init__(self, n_embd=64, n_head=4):
        super().__init__()
        self.n_embd, self.n_head = n_embd, n_head
        self.c_attn, self.c_proj = torch.nn.Linear(n_embd, 3 * n_embd), torch.nn.Linear(n_embd, n_embd)
        self.c_fc, self.mlp_proj = torch.nn.Linear(n_embd, 4 * n_embd), torch.nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(x)))


def _exported(out, name, module, inputs, reference=None, **options):
    """``module`` exported for 2 ranks into ``out/name``, its inputs in ``out/name.npz``;
    returns (export result, the expected output: ``reference``'s or the module's, eager)."""
    result = etmlx.export(module.eval(), inputs, out / name, tensor_parallel=2, **options)
    np.savez(out / f"{name}.npz", *[x.numpy() for x in inputs])
    with torch.no_grad():
        return result, (reference or module)(*inputs).numpy(), module


def _encoder_block(out, name, **sizes):
    return _exported(out, name, EncoderBlock(**sizes), (torch.randint(0, 256, (2, 16)),))


PROMPT, NEW_TOKENS = [5, 17, 3, 99, 42], 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every program the ranks run, exported once: the encoder block, one whose 3 heads do
    not split over 2 ranks, and the tiny Llama (prefill + decode)."""
    from etmlx.llm import causal_lm

    out = tmp_path_factory.mktemp("tp")
    programs = {"block": _encoder_block(out, "block"), "odd_heads": _encoder_block(out, "odd_heads", dim=48, heads=3),
                "qkvo": _exported(out, "qkvo", QkvoBlock(), (torch.randn(2, 8, 64),)),
                "nanogpt": _exported(out, "nanogpt", NanoGptBlock(), (torch.randn(2, 8, 64),))}
    # int8 in groups of 32: each rank's shard quantizes to the same groups as the whole
    # model's (the row-parallel widths, 32 and 128, divide into them)
    block = EncoderBlock()
    programs["quantized"] = _exported(out, "quantized", block, (torch.randint(0, 256, (2, 16)),),
                                      reference=quantized_copy(block, "int8", 32)[0], quantize="int8", group_size=32)
    model = tiny_llama().eval()
    llama = etmlx.export_methods(lambda m: causal_lm.export_methods(m, max_seq_len=8), out / "llama", tensor_parallel=2, model=model)
    np.savez(out / "llama.npz", prompt=np.array(PROMPT), new_tokens=np.array(NEW_TOKENS))
    programs["llama"] = (llama, None, model)
    return out, programs


@pytest.fixture(scope="module", params=etmlx.RUNTIMES)
def ran(request, exported, tmp_path_factory):
    """All of them run by one launch of 2 ranks per runtime (a rank's start-up, the
    native runtime's above all, costs more than the programs)."""
    out, programs = exported
    results = tmp_path_factory.mktemp(request.param)
    for name in programs:
        os.link(out / f"{name}.npz", results / f"{name}.npz")
    jobs = [f"{name}:forward:{out / name}" for name in ("block", "odd_heads", "qkvo", "nanogpt", "quantized")]
    jobs.append(f"llama:generate:{out / 'llama'}")
    done, _ = launch(results, *jobs, runtime=request.param)
    return programs, results, done


@pytest.mark.parametrize("name", ["block", "odd_heads", "qkvo", "nanogpt", "quantized"])
def test_blocks_on_two_ranks(ran, name):
    programs, results, done = ran
    result, expected, block = programs[name]
    for rank, outputs in enumerate(rank_outputs(results, name, done)):
        np.testing.assert_allclose(outputs["out0"], expected, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}")
    if name == "block":
        assert [d.sharded for d in result.decisions] == [True, True]
        # the attention output and the MLP's down projection, each summed across ranks
        assert _nodes(result.ranks[0].path).count("AllSum") == 2
        # a rank holds half of qkv, proj, up, gate and down (3/4 of the weights) and all of the rest
        weights = sum(p.numel() * p.element_size() for p in block.parameters())
        assert result.ranks[0].size_bytes < 0.66 * weights
    elif name == "qkvo":
        assert [str(d) for d in result.decisions] == ["(root) attention: sharded", "(root) mlp: sharded"]
        assert _nodes(result.ranks[0].path).count("AllSum") == 2
    elif name == "nanogpt":
        attention, mlp = result.decisions
        assert not attention.sharded and attention.reason.startswith("its shard does not trace: ") and mlp.sharded
        assert _nodes(result.ranks[0].path).count("AllSum") == 1
    elif name == "quantized":
        assert all(d.sharded for d in result.decisions) and "proj" in result.ranks[0].quantized
        nodes = _nodes(result.ranks[0].path)
        assert nodes.count("AllSum") == 2 and nodes.count("QuantizedMatmul") == 5  # qkv, proj, up, gate, down
    else:  # 3 heads over 2 ranks: the attention is replicated, the MLP still sharded
        attention, mlp = result.decisions
        assert not attention.sharded and "3 heads do not split over 2 ranks" in attention.reason
        assert mlp.sharded
        assert _nodes(result.ranks[0].path).count("AllSum") == 1


def test_tiny_llama_prefill_then_decode_on_two_ranks(ran):
    programs, results, done = ran
    result, _, model = programs["llama"]
    assert all(d.sharded for d in result.decisions) and len(result.decisions) == 4  # 2 layers x (attention, MLP)
    assert _nodes(result.ranks[0].path, kernels=WINDOW_READ).count("AllSum") == 4
    expected_tokens = eager_greedy(model, PROMPT, NEW_TOKENS)
    with torch.no_grad():  # the logits of every position, from the whole sequence at once
        logits = model(torch.tensor([expected_tokens])).logits[0, len(PROMPT) - 1:-1].numpy()
    for rank, outputs in enumerate(rank_outputs(results, "llama", done)):
        assert outputs["tokens"].tolist() == expected_tokens, f"rank {rank}"
        np.testing.assert_allclose(outputs["logits"], logits, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}")


def test_wrong_world_size_is_one_clear_error(exported):
    """This test process is a group of one."""
    out, _ = exported
    with pytest.raises(EtMlxError, match=r"exported for 2 ranks, but this process group has 1: start it with `mlx.launch -n 2"):
        etmlx.load(out / "block")


@pytest.mark.parametrize("content", ['{"size": 2, "ranks": ["../../etc/passwd", "rank1.pte"]}', '{"size": 2}', "not json",
                                     '{"size": true, "ranks": ["rank0.pte"]}', '{"size": 3, "ranks": ["rank0.pte"]}'])
def test_a_damaged_manifest_is_one_clear_error(tmp_path, content):
    (tmp_path / "tensor_parallel.json").write_text(content)
    with pytest.raises(EtMlxError, match="tensor_parallel.json is damaged"):
        etmlx.load(tmp_path)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon"])
def test_a_timeout_that_is_no_duration_is_named(monkeypatch, value):
    monkeypatch.setenv("ETMLX_DISTRIBUTED_TIMEOUT", value)
    with pytest.raises(EtMlxError, match="ETMLX_DISTRIBUTED_TIMEOUT"):
        tensor_parallel._timeout()


def test_a_rank_that_stops_answering_stops_the_others(exported, tmp_path):
    """Rank 1 sleeps instead of calling: rank 0's sum would wait forever on the ring."""
    out, _ = exported
    os.link(out / "block.npz", tmp_path / "block.npz")
    done, seconds = launch(tmp_path, f"block:stall:{out / 'block'}", env={"ETMLX_DISTRIBUTED_TIMEOUT": "3"})
    assert "rank 0 of 2: method 'forward' did not finish within 3 s" in done.stderr + done.stdout
    assert seconds < 60


def test_a_rank_that_dies_fails_the_others(exported, tmp_path):
    out, _ = exported
    os.link(out / "block.npz", tmp_path / "block.npz")
    done, seconds = launch(tmp_path, f"block:die:{out / 'block'}")
    assert "connection to a peer was lost" in done.stderr + done.stdout or "exited with code" in done.stderr + done.stdout
    assert not os.path.exists(tmp_path / "block.rank0.npz")
    assert seconds < 60


def test_tensor_parallel_arguments_are_checked(tmp_path):
    block, tokens = EncoderBlock().eval(), (torch.randint(0, 256, (2, 16)),)
    with pytest.raises(etmlx.ExportError, match="tensor_parallel=0"):
        etmlx.export(block, tokens, tmp_path / "zero", tensor_parallel=0)
    with pytest.raises(etmlx.ExportError, match=r"nothing of EncoderBlock splits over 2 ranks \(\(root\) attention: replicated "
                       r"\(3 heads do not split over 2 ranks\); \(root\) mlp: replicated \(hidden size 147"):
        odd = EncoderBlock(dim=48, heads=3)
        odd.up, odd.gate, odd.down = torch.nn.Linear(48, 147), torch.nn.Linear(48, 147), torch.nn.Linear(147, 48)
        etmlx.export(odd.eval(), tokens, tmp_path / "odd", tensor_parallel=2)
    with pytest.raises(etmlx.ExportError, match=r"no kernel for etmlx's own ops that MLX declined \(etmlx::all_sum: "
                       r"dtype float64 is not computed by MLX here\)"):  # was "Missing out variants"
        etmlx.export(block.double(), tokens, tmp_path / "float64", tensor_parallel=2)


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


def test_blocks_are_found_by_structure_whatever_their_names(tmp_path):
    """BERT's query/key/value and attention.output.dense, intermediate/output dense (the
    ranks' programs run together in eager against the whole model at export)."""
    from examples import hf_models

    model, inputs, _ = hf_models.tiny_bert()
    result = etmlx.export(model, inputs, tmp_path / "bert", tensor_parallel=2)
    assert [str(d) for d in result.decisions] == [
        "model.encoder.layer.0.attention attention: sharded", "model.encoder.layer.0 mlp: sharded",
        "model.encoder.layer.1.attention attention: sharded", "model.encoder.layer.1 mlp: sharded",
    ]
    assert _nodes(result.ranks[0].path).count("AllSum") == 4


def test_attention_without_linear_projections_says_why(tmp_path):
    """GPT-2's projections are Conv1D, not nn.Linear: its attention calls are found and
    left whole with the reason; with nothing else to split, the export says so."""
    from examples import hf_models

    model, inputs, _ = hf_models.tiny_gpt2()
    with pytest.raises(etmlx.ExportError, match=r"nothing of Logits splits over 2 ranks \(.*attention: replicated \(its "
                       r"query, key, value and output are not each one nn.Linear projection\)"):
        etmlx.export(model, inputs, tmp_path / "gpt2", tensor_parallel=2)


class HeadMinorAttention(torch.nn.Module):
    """Heads stored last in each projection's output (view(..., head_dim, heads)): the
    structural reading assumes head-major rows, so the check of the ranks must catch it."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(32, 32) for _ in range(4))

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = (p(x).view(batch, seq, 8, -1).permute(0, 3, 1, 2) for p in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o(y.permute(0, 2, 3, 1).reshape(batch, seq, -1))


def test_a_layout_the_structure_misreads_is_refused_not_written(tmp_path):
    with pytest.raises(etmlx.ExportError, match=r"the sharded programs do not compute the model's 'forward': rank 0's output 0"):
        etmlx.export(HeadMinorAttention().eval(), (torch.randn(1, 5, 32),), tmp_path / "minor", tensor_parallel=2)
    assert not (tmp_path / "minor" / "rank0.pte").exists()
