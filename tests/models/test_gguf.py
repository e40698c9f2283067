"""GGUF files to MLX: ``etmlx export-llm MODEL.gguf`` keeps the file's quantized blocks
quantized (MLX's kernels) and computes what transformers' own GGUF load computes, on
both runtimes. The files are written here (``examples.llm_gguf``: random but valid
blocks of each type, nothing downloaded)."""

import io
import os
import struct
from contextlib import redirect_stdout

import gguf
import numpy as np
import pytest
import torch

import etmlx
from etmlx.llm import gguf_model
from etmlx.cli import main
from etmlx.errors import ExportError
from etmlx.inspection import inspect_program
from examples import llm
from examples.llm_gguf import random_blocks, tiny_gguf
from tests import runtimes

CONTEXT, CHUNK = 64, 8
PROMPT = [1, 17, 42, 9, 88, 23, 5, 61, 70, 33, 12]  # more tokens than one chunk
KEPT = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# every type etmlx keeps quantized, on some layer of a one-layer Llama; the head is tied
# to the Q8_0 embedding (no output.weight), Q6_K's sub-block pairs share their scales
MIXED = {"token_embd.weight": "Q8_0", "attn_q.weight": "Q4_K", "attn_k.weight": "Q5_K", "attn_v.weight": "Q6_K",
         "attn_output.weight": "Q4_0", "ffn_gate.weight": "Q4_1", "ffn_up.weight": "Q5_0", "ffn_down.weight": "Q5_1"}


def transformers_model(path):
    """The reference: transformers' own load of the file (dequantized to float32)."""
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(path)
    return llm.with_static_cache(AutoModelForCausalLM.from_pretrained(folder, gguf_file=name), CONTEXT)


def tensor_bytes(path) -> int:
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    path = tiny_gguf(folder / "mixed.gguf", types=MIXED, tied=True, paired_q6k_scales=True, max_cache=CONTEXT, layers=1)
    out = folder / "out" / "model.pte"
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["export-llm", path, "-o", str(out), "--max-seq-len", str(CHUNK),
                     "--max-context", str(CONTEXT)]) == 0
    return path, out, printed.getvalue(), transformers_model(path)


def test_every_kept_type_runs_on_mlx_quantized_kernels(exported):
    path, out, printed, _ = exported
    for kind in KEPT:
        assert f"run {kind} as int" in printed
    assert "decomposed" not in printed and "all" in printed.split("\n")[0]
    (delegate,) = inspect_program(out)["methods"]["forward"]["delegates"]
    # the layer's 7 projections and the tied head multiply quantized; the embedding gathers rows
    assert delegate["nodes"].count("QuantizedMatmul") == 7 + 1 and "Matmul" not in delegate["nodes"]
    formats = {(w["format"], w["group_size"]) for w in delegate["quantized"]}
    assert formats == {("int4", 32), ("int5", 32), ("int6", 32), ("int8", 32)}


def test_no_float_copy_of_a_weight_is_in_the_file(exported):
    """MLX's layout costs a float16 scale and bias per 32 values (float32 for the K types,
    whose scales float16 cannot hold): this file's weights take 1.11x their GGUF bytes.
    A float32 copy of even the smallest matrix (the k_proj, 128 x 256) would add 30%."""
    path, out, _, _ = exported
    held = inspect_program(out)["held_bytes"]["constants"]
    assert held < 1.15 * tensor_bytes(path)


def test_the_tied_head_reads_the_embeddings_packed_values(exported):
    """The table's packed values are one constant, which the embedding's row gather and
    the head's matmul both read (packing it again for the head set the peak of a small
    model's export; its bytes were stored once either way)."""
    _, out, _, _ = exported
    (delegate,) = inspect_program(out)["methods"]["forward"]["delegates"]
    words = [constant["key"] for constant in delegate["constants"] if constant["dtype"] == "uint32"]
    assert len(words) == 8 and len(set(words)) == len(words)  # the layer's 7 matrices and the table


def test_logits_and_greedy_tokens_equal_transformers_gguf_load(exported):
    """On both runtimes (``tests.runtimes``)."""
    _, out, _, model = exported
    program = runtimes.load(out)
    logits = program.forward(torch.tensor([PROMPT[:CHUNK]]), torch.arange(CHUNK))
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT[:CHUNK]])).logits[:, -1]
    torch.testing.assert_close(torch.as_tensor(np.asarray(logits)), expected, rtol=1e-4, atol=1e-4)
    tokens = llm.greedy(runtimes.load(out), PROMPT, 16)
    eager = llm.eager_greedy(model, PROMPT, 16)  # transformers stops at the EOS token (2) this model reaches
    assert tokens[: len(eager)] == eager and len(set(eager[len(PROMPT):])) > 5


def test_etmlx_generate_prints_the_eager_text(exported, capsys):
    _, out, _, model = exported
    tokenizer = gguf_model.load(exported[0], torch.float32).tokenizer
    prompt = "hello world, the quick"
    ids = tokenizer.encode(prompt)
    eager = llm.eager_greedy(model, ids, 12)[len(ids):]
    eos = model.config.eos_token_id
    eager = eager[: eager.index(eos)] if eos in eager else eager
    capsys.readouterr()
    assert main(["generate", str(out), "--prompt", prompt, "--max-new-tokens", "12"]) == 0
    text = capsys.readouterr().out.strip()
    assert text == tokenizer.decode(eager, skip_special_tokens=True).strip() and text


def test_the_model_is_read_tensor_by_tensor_from_one_parse(exported, monkeypatch):
    """Never transformers' whole-model load (every tensor dequantized at once): the file is
    parsed once, each float tensor is what that load would set, and a quantized weight's
    integers, deferred, are computed from the blocks when read, equal to the eager ones."""
    from transformers import modeling_gguf_pytorch_utils

    from etmlx.lowering import deferred

    path, _, _, model = exported
    checkpoint, parses = modeling_gguf_pytorch_utils.load_gguf_checkpoint, []

    def metadata_only(*args, return_tensors=False, **kwargs):
        assert not return_tensors, "the whole model was dequantized"
        return checkpoint(*args, return_tensors=return_tensors, **kwargs)

    monkeypatch.setattr(modeling_gguf_pytorch_utils, "load_gguf_checkpoint", metadata_only)
    reader = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: parses.append(a) or reader(*a, **k))
    eager = gguf_model.load(path, torch.float32)
    assert len(parses) == 1
    expected = dict(model.named_parameters())
    for name, parameter in eager.model.named_parameters():
        if not hasattr(parameter, "qdata"):  # the norms: F32 in the file
            assert torch.equal(parameter, expected[name]), name
    with deferred.scope():
        lazy = gguf_model.load(path, torch.float32, deferred=True)
        for (name, ours), (_, theirs) in zip(lazy.model.named_parameters(), eager.model.named_parameters()):
            if hasattr(ours, "qdata"):
                assert deferred.resolve(ours.qdata) is not ours.qdata, f"{name} was not deferred"
                assert torch.equal(deferred.resolve(ours.qdata), theirs.qdata), name
                assert torch.equal(ours.scale, theirs.scale) and torch.equal(ours.zero_point, theirs.zero_point)


def test_types_without_an_exact_mlx_layout_run_dequantized_and_are_named(tmp_path):
    """Q6_K whose sub-block pairs have scales of their own, and Q2_K (groups of 16), stay
    float: the reasons are reported, and the model still computes transformers' load."""
    path = tiny_gguf(tmp_path / "declined.gguf", types={"ffn_down.weight": "Q6_K", "attn_output.weight": "Q2_K"},
                     max_cache=CONTEXT)
    loaded = gguf_model.load(path, torch.float32)
    assert sorted(loaded.declined) == sorted(f"model.layers.{i}.{m}.weight" for i in (0, 1)
                                             for m in ("mlp.down_proj", "self_attn.o_proj"))
    assert all("runs on the dequantized weight" in reason for reason in loaded.declined.values())
    assert "scales of their own" in loaded.declined["model.layers.0.mlp.down_proj.weight"]
    assert "model.layers.0.self_attn.q_proj" in loaded.formats and "lm_head" in loaded.formats
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        expected = transformers_model(path)(ids).logits
        torch.testing.assert_close(llm.with_static_cache(loaded.model, CONTEXT)(ids).logits, expected,
                                   rtol=1e-4, atol=1e-4)


def test_a_decoding_that_disagrees_with_transformers_is_left_float(tmp_path, monkeypatch):
    """The guard against a wrong number: rows taken in another order than transformers'
    loader takes them decode to another weight, which is then not run quantized."""
    path = tiny_gguf(tmp_path / "guarded.gguf", max_cache=CONTEXT)
    processed = gguf_model._processed
    monkeypatch.setattr(gguf_model, "_processed", lambda tensor, processor: (
        lambda name, order: (name, order if order is None or "attn_q" not in name else order.flip(0)))(
        *processed(tensor, processor)))
    loaded = gguf_model.load(path, torch.float32)
    assert sorted(loaded.declined) == [f"model.layers.{i}.self_attn.q_proj.weight" for i in (0, 1)]
    assert "differ from the weight transformers loads" in loaded.declined["model.layers.0.self_attn.q_proj.weight"]


def test_bfloat16_keeps_the_layers_quantized_near_its_rounding(tmp_path):
    from transformers import AutoModelForCausalLM

    path = tiny_gguf(tmp_path / "bf16.gguf", types=MIXED, paired_q6k_scales=True, max_cache=CONTEXT)
    loaded = gguf_model.load(path, torch.bfloat16)
    assert not loaded.declined and len(loaded.formats) == 2 * 7 + 2
    def logits(model):
        with torch.no_grad():
            return model(torch.tensor([PROMPT])).logits.float()

    exact = logits(AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="bf16.gguf"))
    rounded = logits(AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="bf16.gguf", dtype=torch.bfloat16))
    # scales and zero points round to bfloat16 too: measured 2.0x as far from the float32
    # model as transformers' own bfloat16 load, whose weights round once
    assert float((logits(loaded.model) - exact).abs().max()) < 3 * float((rounded - exact).abs().max())


def test_lowering_takes_each_weight_packed_a_block_of_rows_at_a_time(exported, monkeypatch):
    """The packed words a GGUF load offers lowering, decoded from the file's blocks a block
    of rows at a time (an embedding's integers are never whole: 0.25 GB at 1B), are its
    integers packed whole, for every type kept."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from etmlx.lowering import deferred
    from etmlx.lowering.rules.quantized import packed_form, packed_integers
    from etmlx.quant import intx

    monkeypatch.setattr(intx, "ROWS_AT_ONCE_VALUES", 3 * 256)  # three rows a block, one short at the end
    with deferred.scope():
        model = gguf_model.load(exported[0], torch.float32, deferred=True).model
        weights = {id(m.weight): m.weight for m in model.modules()
                   if isinstance(getattr(m, "weight", None), IntxUnpackedToInt8Tensor)}
        assert len(weights) == 8  # the layer's 7 matrices and the table (the head's too)
        for weight in weights.values():
            bits = int(str(weight.target_dtype).removeprefix("torch.int"))
            offered = deferred.prepared(weight.qdata, packed_form(bits), lambda values: None)
            whole = packed_integers(deferred.resolve(weight.qdata), bits)
            assert offered is not None and (offered.data, offered.shape) == (whole.data, whole.shape)


@pytest.mark.parametrize("kind", KEPT)
def test_each_type_decodes_to_what_gguf_dequantizes(kind):
    rng = np.random.default_rng(1)
    raw = random_blocks(rng, kind, 6, 512, paired_q6k_scales=True)
    unsigned, scale, bias, bits = gguf_model._fields(torch.from_numpy(raw), kind, 6, 512)
    assert int(unsigned.min()) >= 0 and int(unsigned.max()) < 2**bits
    weight = scale.repeat_interleave(32, -1) * unsigned + bias.repeat_interleave(32, -1)
    expected = gguf.dequantize(raw, gguf.GGMLQuantizationType[kind])
    np.testing.assert_allclose(weight.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_quantize_with_a_gguf_file_is_refused(exported, tmp_path):
    with pytest.raises(ExportError, match=r"GGUF file: its own quantization is kept"):
        etmlx.export_llm(exported[0], tmp_path / "m.pte", quantize="int4")


def _type_field_offset(path, tensor_name: str) -> int:
    """Where the GGML type of ``tensor_name``'s entry in the file's tensor infos is."""
    data = open(path, "rb").read()
    at = data.index(struct.pack("<Q", len(tensor_name)) + tensor_name.encode())
    at += 8 + len(tensor_name)
    dims = struct.unpack_from("<I", data, at)[0]
    return at + 4 + 8 * dims


def _damaged(tmp_path, how: str) -> str:
    good = tiny_gguf(tmp_path / "good.gguf", hidden=256, layers=1)
    data = bytearray(open(good, "rb").read())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "not gguf":
        data[:4] = b"NOPE"
    elif how == "unknown type":
        struct.pack_into("<I", data, _type_field_offset(good, "blk.0.attn_q.weight"), 250)
    path = tmp_path / f"{how.replace(' ', '_')}.gguf"
    path.write_bytes(bytes(data))
    return str(path)


@pytest.mark.parametrize("how, match", [
    ("truncated", r"truncated\.gguf: not a valid GGUF file: truncated or damaged \("),
    ("not gguf", r"not_gguf\.gguf: not a valid GGUF file: truncated or damaged \("),
    ("unknown type", r"unknown_type\.gguf: not a valid GGUF file: a tensor of unknown type 250$"),
])
def test_a_damaged_file_is_one_clear_error(tmp_path, how, match):
    with pytest.raises(ExportError, match=match):
        gguf_model.load(_damaged(tmp_path, how), torch.float32)


def test_an_unknown_architecture_or_missing_file_is_one_clear_error(tmp_path):
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "nonesuch")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ExportError, match=r"transformers cannot load .*odd\.gguf as a causal LM: .*nonesuch"):
        gguf_model.load(str(path), torch.float32)
    with pytest.raises(ExportError, match=r"absent\.gguf: no such GGUF file"):
        gguf_model.load(str(tmp_path / "absent.gguf"), torch.float32)


@pytest.mark.parametrize("key, value, match", [
    ("llama.block_count", 3, r"inconsistent\.gguf: its tensors do not make a LlamaForCausalLM: missing \["),
    ("llama.feed_forward_length", 256, r"inconsistent\.gguf \(blk\.0\.ffn_gate\.weight\): its tensors do not make a LlamaForCausalLM: "
                                       r"model\.layers\.0\.mlp\.gate_proj\.weight is \(512, 256\) in the file"),
])
def test_tensors_that_do_not_make_the_model_are_one_clear_error(tmp_path, key, value, match):
    """Metadata saying three layers over the tensors of one, or a narrower MLP than its
    (quantized) matrices have."""
    good = tiny_gguf(tmp_path / "good.gguf", layers=1)
    data = bytearray(open(good, "rb").read())
    struct.pack_into("<I", data, _field_offset(data, key), value)
    path = tmp_path / "inconsistent.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ExportError, match=match):
        gguf_model.load(str(path), torch.float32)


def _field_offset(data: bytes, key: str) -> int:
    """Where the uint32 value of metadata ``key`` is (after its name and type)."""
    return data.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key) + 4
