"""``export-llm`` reads a checkpoint in place: its weights stay memory-mapped in the
checkpoint's dtype, a quantized weight's integers are made only as lowering packs it
(lowering/deferred.py), and the program is byte for byte what quantizing the loaded
model first writes. A damaged or incomplete checkpoint is one error that names it."""

import hashlib
import os
import shutil

import numpy as np
import pytest
import torch
from repeated import tiny

import etmlx
from etmlx.llm.generation import Session
from etmlx.lowering import mapped_pages
from etmlx.llm import safetensors_file
from etmlx.cli import main
from etmlx.errors import ExportError
from etmlx.inspection import inspect_program
from etmlx.lowering import deferred
from examples import llm

CONTEXT = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A one-layer Llama saved in bfloat16, with its tokenizer."""
    directory = tmp_path_factory.mktemp("bf16")
    model = llm.tiny_llama(layers=1).to(torch.bfloat16)
    model.save_pretrained(directory)
    llm.train_tokenizer(model.config.vocab_size).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def deferred_export(checkpoint, tmp_path_factory):
    """``export-llm`` of the checkpoint at its default dtype (the checkpoint's), int4."""
    from etmlx.llm.export import export_llm

    path = tmp_path_factory.mktemp("deferred") / "model.pte"
    export_llm(checkpoint, path, max_context=CONTEXT, quantize="int4", group_size=32)
    return path


def test_the_deferred_export_writes_the_bytes_of_quantizing_first(checkpoint, deferred_export, tmp_path):
    """The same file as the model loaded in bfloat16, quantized at once, then exported:
    every linear layer and the head a QuantizedMatmul, the embedding's rows dequantized."""
    from transformers import AutoModelForCausalLM

    from etmlx.llm import causal_lm
    from etmlx.exporter import export_methods
    from etmlx.quant.weights import quantized_copy

    model = causal_lm.with_static_cache(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16), CONTEXT)
    quantized, names = quantized_copy(model, "int4", 32)
    assert len(names) == 7 + 2
    export_methods(causal_lm.export_methods(quantized, CONTEXT, CONTEXT), tmp_path / "eager.pte")
    assert deferred_export.read_bytes() == (tmp_path / "eager.pte").read_bytes()
    nodes = inspect_program(deferred_export)["methods"]["forward"]["delegates"][0]["nodes"]
    assert nodes.count("QuantizedMatmul") == 7 + 1 and "Dequantize" in nodes  # projections, head; embedding
    # its logits come as float32 (numpy holds bfloat16 as bit patterns, whose argmax is another token)
    prompt = [3, 17, 40, 9, 21]
    with torch.no_grad():
        expected = quantized(torch.tensor([prompt])).logits[0, -1].float()
    for runtime in etmlx.RUNTIMES:
        logits = Session(etmlx.load(deferred_export, runtime=runtime)).feed(prompt)
        assert logits.dtype == np.float32 and logits.argmax() == expected.argmax()
        torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=0.02, atol=0.02)


def test_another_dtype_writes_the_bytes_of_loading_in_it(checkpoint, tmp_path):
    """``--dtype float32`` of a bfloat16 checkpoint reads each weight from the mapped file
    as lowering or the quantizer needs it (``deferred.converted``), and writes the file
    that loading the whole model in float32 first writes."""
    from transformers import AutoModelForCausalLM

    from etmlx.llm import causal_lm
    from etmlx.llm.export import export_llm
    from etmlx.exporter import export_methods
    from etmlx.quant.weights import quantized_copy

    export_llm(checkpoint, tmp_path / "lazy.pte", max_context=CONTEXT, quantize="int4", group_size=32, dtype="float32")
    model = causal_lm.with_static_cache(AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32), CONTEXT)
    quantized, _ = quantized_copy(model, "int4", 32)
    export_methods(causal_lm.export_methods(quantized, CONTEXT, CONTEXT), tmp_path / "eager.pte")
    assert (tmp_path / "lazy.pte").read_bytes() == (tmp_path / "eager.pte").read_bytes()


def _answered(monkeypatch) -> set:
    """The jobs the packing worker answers from now on, by index (filled as they are read)."""
    from etmlx.quant import pack_worker

    answered, result = set(), pack_worker._Worker.result

    def counted(worker, index):
        value = result(worker, index)
        if value is not None:
            answered.add(index)
        return value

    monkeypatch.setattr(pack_worker._Worker, "result", counted)
    return answered


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_a_worker_process_quantizes_every_weight_to_the_same_bytes(checkpoint, deferred_export, dtype, tmp_path,
                                                                   monkeypatch):
    """With ``ETMLX_PACK_WORKER=1`` (a checkpoint this small gets none by default) every
    weight is quantized and packed by the worker process (``etmlx/quant/pack_worker.py``),
    from the mapped file, in the checkpoint's dtype and converted to float32: the file
    this process writes alone."""
    from etmlx.llm.export import export_llm

    options = dict(max_context=CONTEXT, quantize="int4", group_size=32, dtype=dtype)
    if dtype is None:
        alone = deferred_export
    else:
        monkeypatch.setenv("ETMLX_PACK_WORKER", "0")
        export_llm(checkpoint, alone := tmp_path / "alone.pte", **options)
    monkeypatch.setenv("ETMLX_PACK_WORKER", "1")
    answered = _answered(monkeypatch)
    export_llm(checkpoint, tmp_path / "worker.pte", **options)
    assert len(answered) == 7 + 2  # the projections, the embedding, the head
    assert (tmp_path / "worker.pte").read_bytes() == alone.read_bytes()


def test_weights_the_worker_cannot_read_are_quantized_here(checkpoint, deferred_export, tmp_path, monkeypatch):
    """Weights named to the worker by a place it cannot read (here: past their file's end)
    get no answer, from the worker or from this process taking them over while it waits;
    they are quantized here from the tensors, to the same file."""
    from etmlx.llm.export import export_llm
    from etmlx.quant import pack_worker

    monkeypatch.setenv("ETMLX_PACK_WORKER", "1")
    monkeypatch.setattr(pack_worker._Worker, "locate", lambda worker, tensor: (next(iter(worker.files)), 2**40))
    answered = _answered(monkeypatch)
    export_llm(checkpoint, tmp_path / "model.pte", max_context=CONTEXT, quantize="int4", group_size=32)
    assert not answered and (tmp_path / "model.pte").read_bytes() == deferred_export.read_bytes()


@pytest.mark.parametrize("kernel_copies", [True, False])
def test_a_file_backed_constant_is_copied_into_the_program_where_it_is_written(kernel_copies, tmp_path,
                                                                                monkeypatch):
    """Bytes left in a file (the worker's packed words, a spilled constant) land at the
    program's position, by the kernel's copy or, where it refuses (another filesystem),
    by ExecuTorch's own; the file is removed then."""
    import errno

    from etmlx.lowering.spilled import copied_file

    (tmp_path / "words").write_bytes(payload := os.urandom(3 * 2**20 + 5))
    if not kernel_copies:
        def refused(*arguments):
            raise OSError(errno.EXDEV, "cross-device")

        monkeypatch.setattr(os, "copy_file_range", refused, raising=False)
    with open(tmp_path / "program", "wb") as program:
        program.write(b"head")
        copied_file(str(tmp_path / "words"), hashlib.sha256(payload).digest()).write_to_file(program)
        program.write(b"tail")
    assert (tmp_path / "program").read_bytes() == b"head" + payload + b"tail"
    assert not (tmp_path / "words").exists()  # the disk holds the bytes once


def test_large_constants_wait_in_files_for_the_program(checkpoint, tmp_path, monkeypatch):
    """Constants of ``SPILLED_BYTES`` or more (here 1 KiB) wait in files beside the output
    from when they are lowered until the program is written (``lowering/spilled.py``),
    one file for every method that stores them, named with the SHA-256 of its bytes:
    the same program, and nothing left beside it."""
    from etmlx.llm.export import export_llm
    from etmlx.lowering import spilled

    def exported(folder):
        (tmp_path / folder).mkdir()
        export_llm(checkpoint, tmp_path / folder / "model.pte", max_context=CONTEXT, quantize="int4", group_size=32,
                   verify=True)  # forward and verify: two delegates of the same weights
        return tmp_path / folder

    kept = exported("kept")
    monkeypatch.setattr(spilled, "SPILLED_BYTES", 1024)
    made, copied_file = {}, spilled.copied_file
    monkeypatch.setattr(spilled, "copied_file", lambda path, sha256: made.setdefault(sha256, []).append(
        (os.path.dirname(os.path.dirname(path)), hashlib.sha256(open(path, "rb").read()).digest()))
        or copied_file(path, sha256))
    out = exported("out")
    assert len(made) >= 7 + 2 and all(files == [(str(out), sha256)] for sha256, files in made.items())
    assert (out / "model.pte").read_bytes() == (kept / "model.pte").read_bytes()
    assert sorted(os.listdir(out)) == sorted(os.listdir(kept))


def test_a_worker_that_fails_says_why_as_it_is_stopped(checkpoint, caplog):
    from etmlx.quant import pack_worker

    worker = pack_worker._Worker(1)
    path = str(next(checkpoint.glob("*.safetensors")))
    worker.send((path, 2**40, (4, 64), "bfloat16", "bfloat16", "int4", 32))
    with worker._arrived:
        assert worker._arrived.wait_for(lambda: worker._ended, timeout=120)
    worker.stop()
    assert "the packing worker stopped (" in caplog.text and "mmap" in caplog.text


def _tiny_bf16_checkpoint(family: str, directory, **settings):
    tiny(family, num_hidden_layers=1, head_dim=16, **settings).to(torch.bfloat16).save_pretrained(directory)
    return directory


def _deferred(tensor) -> bool:
    return deferred.resolve(tensor) is not tensor


def _tensors(model) -> dict:
    return {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}


@pytest.mark.parametrize("family", ["Gemma", "Apertus"])
def test_another_dtype_maps_each_parameter_and_makes_what_loading_in_it_makes(family, tmp_path):
    """Every parameter a placeholder over the mapped file, each equal when read to what a
    float32 load holds; what transformers computes rather than loads in float32 (Gemma's
    embedding scale, which a bfloat16 load rounds), ties (Gemma's head) and converts
    (Apertus's activation buffers, converted as they load) is as that load has it."""
    from transformers import AutoModelForCausalLM

    from etmlx.llm.checkpoint_files import load_checkpoint

    directory = _tiny_bf16_checkpoint(family, tmp_path)
    eager = _tensors(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32))
    with deferred.scope():
        model = load_checkpoint(AutoModelForCausalLM, directory, "float32", "a causal LM", converted_when_read=True)
        assert all(_deferred(p) for p in model.parameters())
        # lowering shares parameters with its copy of the program, not buffers (edge_passes)
        assert not any(_deferred(b) for b in model.buffers())
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == (family == "Gemma")
        lazy = _tensors(model)
        assert lazy.keys() == eager.keys()
        for name, tensor in lazy.items():
            assert tensor.dtype == eager[name].dtype and torch.equal(deferred.resolve(tensor), eager[name]), name


def test_a_model_transformers_loads_otherwise_is_loaded_whole(tmp_path):
    """DeepSeek-V3 keeps its expert-score bias in float32 whatever the dtype: transformers
    would convert the placeholder given for it, so the model is loaded in the dtype
    asked for, whole, as a plain load makes it."""
    from transformers import AutoModelForCausalLM

    from etmlx.llm.checkpoint_files import load_checkpoint

    directory = _tiny_bf16_checkpoint("DeepseekV3", tmp_path, moe_intermediate_size=32, n_routed_experts=4,
                                      num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
                                      q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                      v_head_dim=8)
    eager = _tensors(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float16))
    with deferred.scope():
        model = load_checkpoint(AutoModelForCausalLM, directory, "float16", "a causal LM", converted_when_read=True)
        lazy = _tensors(model)
        assert not any(_deferred(t) for t in lazy.values())
    assert eager["model.layers.0.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert lazy.keys() == eager.keys() and all(
        t.dtype == eager[n].dtype and torch.equal(t, eager[n]) for n, t in lazy.items())


def test_generating_in_half_precision_on_the_cpu_says_why_it_is_slow(deferred_export, capsys):
    assert main(["generate", str(deferred_export), "--prompt", "hello", "--max-new-tokens", "2"]) == 0
    assert "computes in bfloat16" in capsys.readouterr().err


def _copy(checkpoint, tmp_path):
    return shutil.copytree(checkpoint, tmp_path / "copy")


def test_a_truncated_checkpoint_names_the_file_and_tensor(checkpoint, tmp_path, capsys):
    copy = _copy(checkpoint, tmp_path)
    weights = os.path.join(copy, "model.safetensors")
    header = safetensors_file.check(weights)
    last = max((name for name in header if name != "__metadata__"), key=lambda name: header[name]["data_offsets"][1])
    os.truncate(weights, os.path.getsize(weights) - 10)
    assert main(["export-llm", str(copy), "-o", str(tmp_path / "x.pte")]) == 1
    assert f"model.safetensors: tensor {last} ends at byte" in capsys.readouterr().err
    with open(weights, "r+b") as f:
        f.write(b"\xff" * 8)  # a header longer than the file
    with pytest.raises(ExportError, match="damaged safetensors file"):
        safetensors_file.check(weights)


def test_a_checkpoint_missing_a_tensor_is_refused_by_name(checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    copy = _copy(checkpoint, tmp_path)
    weights = os.path.join(copy, "model.safetensors")
    tensors = load_file(weights)
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    assert main(["export-llm", str(copy), "-o", str(tmp_path / "x.pte")]) == 1
    assert "lacks 1 tensor(s) LlamaForCausalLM needs: model.layers.0.mlp.down_proj.weight" in capsys.readouterr().err
    assert not (tmp_path / "x.pte").exists()


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssFile:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_released_pages_of_a_mapped_file_read_back_the_same(tmp_path):
    """A weight's pages are given back (most of its 8 MiB), and read back the same: a
    clean one dropped, one a write made private (safetensors maps files private and
    writable) paged out, its written value kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    save_file({"clean": torch.randn(2048, 1024), "written": torch.randn(2048, 1024)}, tmp_path / "w.safetensors")
    with safe_open(tmp_path / "w.safetensors", framework="pt", backend="mmap") as f:
        for name in ("clean", "written"):
            mapped = f.get_slice(name)[...]
            if name == "written":
                mapped[1000, 0] = 1234.5
            total = mapped.sum()
            before = _rss_file_kib()
            assert mapped_pages.release(mapped)
            assert _rss_file_kib() < before - 4096, name
            assert torch.equal(mapped.sum(), total), name
        assert mapped[1000, 0] == 1234.5
    anonymous = torch.randn(2048, 1024)
    total = anonymous.sum()
    assert not mapped_pages.release(anonymous) and torch.equal(anonymous.sum(), total)


def test_deferred_constants_resolve_inside_their_scope_only():
    with pytest.raises(RuntimeError, match="inside deferred.scope"):
        deferred.placeholder((2, 3), torch.int8, lambda: torch.ones(2, 3, dtype=torch.int8))
    with deferred.scope():
        made = deferred.placeholder((2, 3), torch.int8, lambda: torch.full((2, 3), 7, dtype=torch.int8))
        parameter = torch.nn.Parameter(made, requires_grad=False)  # what the edge passes hold: the same storage
        assert torch.equal(deferred.resolve(parameter), torch.full((2, 3), 7, dtype=torch.int8))
        view = made[1:]  # another tensor over part of it is not the placeholder
        assert deferred.resolve(view) is view
    assert deferred.resolve(made) is made


def test_tracing_reads_no_weight(checkpoint):
    """``causal_lm``'s trace computes on fake tensors only: a model whose weights and
    caches hold no values at all (the meta device) traces as a loaded one does (for a
    real model: no page of its checkpoint is read before lowering writes it)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from etmlx.llm import causal_lm

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(checkpoint))
    programs = causal_lm.export_methods(causal_lm.with_static_cache(model, CONTEXT), 4, CONTEXT)
    assert {p.device.type for p in programs["forward"].state_dict.values()} == {"meta"}


def test_an_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    from etmlx.pipeline import to_executorch, write

    program, report = to_executorch(torch.nn.Linear(4, 4), (torch.randn(1, 4),))

    def interrupted(f):
        f.write(b"half a program")
        raise KeyboardInterrupt

    monkeypatch.setattr(program, "write_to_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write(program, report, tmp_path / "model.pte")
    assert list(tmp_path.iterdir()) == []


def test_the_lowering_bar_is_drawn_only_when_shown(capsys):
    from etmlx import progress

    with progress.bar("lowering", 3) as bar:
        bar.advance(3)
    assert capsys.readouterr().err == ""
    with progress.shown(), progress.bar("lowering", 3) as bar:
        bar.advance(3)
    assert capsys.readouterr().err.endswith(f"\rlowering [{'#' * progress.WIDTH}] 3/3\n")
