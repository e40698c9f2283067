"""Weight-only quantized linear and embedding layers (torchao's configs) on MLX's
quantized kernels; parity is against the torchao-quantized model in eager PyTorch."""

import copy

import pytest
import torch
from lowering_harness import assert_close
from ruletest import delegated, untested_rules
from torchao.quantization import IntxWeightOnlyConfig, MappingType, quantize_
from torchao.quantization.granularity import PerAxis, PerGroup

import etmlx
import runtimes
from etmlx.errors import ExportError
from etmlx.inspection import inspect_program
from etmlx.quant.weights import formats, quantized_copy
from etmlx.runtime_shim.errors import IndexRangeError


class Layers(torch.nn.Module):
    def __init__(self, vocab=96, width=256, hidden=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.embed(ids))))


def _quantized(config, embeddings=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = Layers().to(dtype).eval()
    quantize_(model, config)
    if embeddings:
        quantize_(model, config, filter_fn=lambda module, _: isinstance(module, torch.nn.Embedding))
    return model


def _constants(lowered) -> list:
    return [c for delegate in lowered.delegates for c in delegate["constants"]]


CONFIGS = {
    "int4-g32": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    "int4-g64": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(64)),
    "int4-g128-asym": IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=PerGroup(128), mapping_type=MappingType.ASYMMETRIC
    ),
    "int8-g64": IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerGroup(64)),
    "int8-per-channel": IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
    "int2-g32": IntxWeightOnlyConfig(weight_dtype=torch.int2, granularity=PerGroup(32)),
    # 3, 5 and 6 bits: some values straddle two of MLX's uint32 words
    "int3-g32": IntxWeightOnlyConfig(weight_dtype=torch.int3, granularity=PerGroup(32)),
    "int5-g64": IntxWeightOnlyConfig(weight_dtype=torch.int5, granularity=PerGroup(64)),
    "int6-g128-asym": IntxWeightOnlyConfig(
        weight_dtype=torch.int6, granularity=PerGroup(128), mapping_type=MappingType.ASYMMETRIC
    ),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_quantized_layers_run_on_mlx_kernels(name):
    model = _quantized(CONFIGS[name])
    ids = torch.tensor([[0, 5, 95, 17], [3, 3, 60, 1]])
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul", "Dequantize"], run_with=[(ids.flip(1),)])
    # The weights are in the file packed, never as floats.
    assert not any(c["dtype"] == "float32" and len(c["shape"]) == 2 and min(c["shape"]) > 32 for c in _constants(lowered))
    packed = [c for c in _constants(lowered) if c["dtype"] == "uint32"]
    assert len(packed) == 3
    # etmlx inspect says the format each quantized weight runs in, and its shape
    weights = [w for delegate in lowered.delegates for w in delegate["quantized"]]
    assert {w["format"] for w in weights} == {name.split("-")[0]}
    assert sorted(tuple(w["shape"]) for w in weights) == [(96, 128), (96, 256), (128, 256)]


def test_greedy_tokens_match_the_quantized_model_in_eager():
    model = _quantized(CONFIGS["int4-g64"], seed=1)
    ids = torch.randint(0, 96, (1, 12))
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul"])
    with torch.no_grad():
        assert torch.equal(lowered.program.forward(ids).argmax(-1), model(ids).argmax(-1))


def test_the_tied_table_of_two_identical_quantized_weights_is_stored_once():
    """A lookup table used as the output projection too (tied embeddings), quantized
    alike for both uses: one packed copy in the file."""
    torch.manual_seed(0)
    model = Layers(width=128, hidden=128)
    model.down.weight = model.embed.weight
    config = CONFIGS["int4-g32"]
    quantize_(model, config)
    quantize_(model, config, filter_fn=lambda module, _: isinstance(module, torch.nn.Embedding))
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul", "Dequantize"])
    tables = [c["key"] for c in _constants(lowered) if c["dtype"] == "uint32" and c["shape"] == [96, 16]]
    assert len(tables) == 2 and len(set(tables)) == 1  # two uses, one named blob (keys hash the bytes)


def test_an_out_of_range_id_into_a_quantized_table_raises():
    model = _quantized(CONFIGS["int4-g32"])
    lowered = delegated(model, (torch.tensor([[1, 2]]),), nodes=["Dequantize", "CheckIndex"])
    with pytest.raises(IndexRangeError, match="holds index 96, out of range"):  # on every runtime alike
        lowered.program.forward(torch.tensor([[1, 96]]))


@pytest.mark.parametrize(
    "config,reason",
    [
        (IntxWeightOnlyConfig(weight_dtype=torch.int7, granularity=PerGroup(32)), "7-bit weights"),
        (IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16)), "groups of 16"),
    ],
    ids=["int7", "group-16"],
)
def test_what_mlx_cannot_compute_is_dequantized_at_export_and_still_exact(config, reason):
    model = _quantized(config, embeddings=False)
    ids = torch.tensor([[0, 5, 95, 17]])
    lowered = delegated(model, (ids,))
    assert "QuantizedMatmul" not in lowered.nodes
    entry = lowered.report.operators["aten::linear"]
    assert entry.decomposed and reason in entry.decomposed[0][1]
    assert "torchao::dequantize_affine" in lowered.report.operators


def test_half_precision_weights_dequantize_in_half():
    model = _quantized(CONFIGS["int4-g64"], embeddings=False, dtype=torch.float16)
    ids = torch.tensor([[0, 5, 95, 17]])
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul"])
    assert all(c["dtype"] in ("uint32", "float16") for c in _constants(lowered))


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_weights_multiply_in_float32_on_the_cpu(dtype, rows, monkeypatch):
    """MLX's CPU quantized matmul in half precision takes 7.6x its float32 time (a decode
    step of a bfloat16 export); from 4 rows on the weights are dequantized and multiplied
    densely (from 8 in float32: test_matmul). Both runtimes match eager either way; the
    Python runtime hands MLX's quantized kernel float32 operands only."""
    import mlx.core as mx

    model = _quantized(CONFIGS["int4-g64"], embeddings=False, dtype=dtype)
    ids = torch.arange(rows)[None] % 96
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul"])
    seen = []

    def recorded(x, *operands, _kernel=mx.quantized_matmul, **options):
        seen.append(x.dtype)
        return _kernel(x, *operands, **options)

    monkeypatch.setattr(mx, "quantized_matmul", recorded)
    etmlx.load(lowered.pte).forward(ids)  # traced afresh, through the recording kernel
    assert seen == ([mx.float32, mx.float32] if rows == 1 else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scheme", ["int4-g64", "int8-g64", "int2-g32"])
def test_a_prefill_dequantizes_a_weight_a_block_of_rows_at_a_time(scheme, dtype, monkeypatch):
    """From 4 rows on the CPU dequantizes each weight for a dense product: a block of rows
    at a time, each after the one before, so MLX holds a few blocks and not the whole
    dense weight (with its dequantize's working set, several times it). The product is
    the whole weight's, whatever the blocks (the native runtime's are larger), to within
    float32 rounding (OpenBLAS may round a product of a block apart)."""
    import mlx.core as mx

    from etmlx.runtime_shim.mlx_ops import quantized

    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 4096, bias=False).to(dtype).eval()
    quantize_(model, CONFIGS[scheme])
    x = torch.randn(1, 16, 1024, dtype=dtype)
    lowered = delegated(model, (x,), nodes=["QuantizedMatmul"])
    dense_bytes = 4096 * 1024 * x.element_size()

    def run(runtime, block_values):
        monkeypatch.setattr(quantized, "CPU_DEQUANTIZED_BLOCK_VALUES", block_values)
        program = etmlx.load(lowered.pte, runtime=runtime)
        program.forward(x)  # the constants loaded
        mx.eval([])
        held = mx.get_active_memory()
        mx.reset_peak_memory()
        return program.forward(x), mx.get_peak_memory() - held

    blocked, blocked_peak = run("python", 2**16)  # 64 blocks of 64 rows
    whole, whole_peak = run("python", 2**40)
    native, _ = run("executorch", 2**17)
    rounding = {} if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)  # bfloat16: one rounding of it
    torch.testing.assert_close(blocked, whole, **rounding)
    torch.testing.assert_close(native, whole, **rounding)
    assert blocked_peak < dense_bytes / 2 < dense_bytes <= whole_peak, (blocked_peak, whole_peak)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_the_cpu_dequantizes_words_bytewise_as_mlx_does(bits):
    """The CPU's own dequantize of 2, 4 and 8 bits gives MLX's values bit for bit, in
    every scale dtype and group size (3 bits is MLX's own)."""
    import mlx.core as mx

    from etmlx.runtime_shim.mlx_ops.quantized import _cpu_dequantize

    for dtype in (mx.float32, mx.bfloat16, mx.float16):
        for group_size in (32, 64, 128):
            words, scales, biases = mx.quantize(mx.random.normal((2, 96, 256)), group_size=group_size, bits=bits)
            scales, biases = scales.astype(dtype), biases.astype(dtype)
            parameters = dict(group_size=group_size, bits=bits, mode="affine")
            for out in (dtype, mx.float32):
                expected = mx.dequantize(words, scales, biases, **parameters, dtype=out)
                assert mx.array_equal(_cpu_dequantize(words, scales, biases, parameters, out), expected).item()


def test_scales_that_would_broadcast_are_refused_as_mlx_refuses_them():
    """One group's scales for a row of four groups: MLX's dequantize says the shapes do
    not match; the CPU's own must not broadcast them into a wrong weight."""
    import mlx.core as mx

    from etmlx.runtime_shim.mlx_ops.quantized import _cpu_dequantize

    words, scales, biases = mx.quantize(mx.random.normal((96, 256)), group_size=64, bits=4)
    with pytest.raises(ValueError, match="Shape of scales and biases does not match"):
        _cpu_dequantize(words, scales[:, :1], biases[:, :1], dict(group_size=64, bits=4, mode="affine"), mx.float32)


def test_blocks_of_a_quantized_cache_split_its_positions_not_its_heads(monkeypatch):
    """Attention over a quantized cache (batch, heads, positions, packed dims): the blocks
    are positions of every head, the scores those of the whole cache (to float32
    rounding: OpenBLAS's small-matrix kernels round a 64-wide block's apart)."""
    import mlx.core as mx

    from etmlx.runtime_shim.mlx_ops import quantized
    from etmlx.runtime_shim.mlx_ops.matmul import product

    monkeypatch.setattr(quantized, "CPU_DEQUANTIZED_BLOCK_VALUES", 2**14)  # 64 positions a block
    queries = mx.random.normal((2, 4, 9, 64))
    for bits in (3, 4, 8):
        words, scales, biases = mx.quantize(mx.random.normal((2, 4, 700, 64)), group_size=64, bits=bits)
        parameters = dict(group_size=64, bits=bits, mode="affine")
        keys = mx.dequantize(words, scales, biases, **parameters, dtype=mx.float32)
        scores = quantized._dequantized_by_blocks(queries, words, scales, biases, parameters)
        assert mx.allclose(scores, product(queries, mx.swapaxes(keys, -1, -2)), rtol=1e-6, atol=1e-5).item()


def test_export_quantizes_a_copy_for_the_user(tmp_path):
    torch.manual_seed(0)
    model = Layers().eval()
    ids = torch.tensor([[7, 0, 95]])
    result = etmlx.export(model, (ids,), tmp_path / "int8.pte", quantize="int8", group_size=None)
    assert result.quantized == ("embed", "up", "down")
    assert type(model.up.weight) is torch.nn.Parameter  # the caller's model stays float
    reference, _ = quantized_copy(model, "int8", None)
    with torch.no_grad():
        assert_close(runtimes.load(result.path).forward(ids), reference(ids))
    (delegate,) = inspect_program(result.path)["methods"]["forward"]["delegates"]
    assert delegate["nodes"].count("QuantizedMatmul") == 2 and "Dequantize" in delegate["nodes"]


@pytest.mark.parametrize("scheme,group_size,error", [("int7", 64, "quantize='int7'"), ("int4", 48, "group_size=48")])
def test_export_names_a_quantization_it_does_not_offer(tmp_path, scheme, group_size, error):
    with pytest.raises(ExportError, match=error):
        etmlx.export(Layers(), (torch.tensor([[1]]),), tmp_path / "x.pte", quantize=scheme, group_size=group_size)


class ExpertStack(torch.nn.Module):
    """A stack of expert matrices indexed by ids the caller passes, the way transformers'
    experts modules read theirs (``has_gate`` marks those modules)."""

    has_gate = True

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(4, 8, 64))

    def forward(self, ids, x):
        return torch.bmm(self.gate_up_proj[ids], x)


@pytest.mark.parametrize("scheme", ["int4", "int6", "int8"])
def test_a_quantized_expert_stack_indexed_by_any_ids(scheme):
    """Ids from an input are not in range by construction: the chosen matrices are
    gathered (bounds-checked) and dequantized, as an embedding's rows, then multiplied."""
    model, names = quantized_copy(ExpertStack(), scheme, 32)
    assert names == ["gate_up_proj"]
    ids, x = torch.tensor([3, 0, 3, -1]), torch.randn(4, 64, 2)
    lowered = delegated(model, (ids, x), nodes=["CheckIndex", "Dequantize", "Matmul"])
    assert "GatherQmm" not in lowered.nodes
    with pytest.raises(IndexRangeError, match="holds index 4, out of range"):
        lowered.program.forward(torch.tensor([3, 0, 4, 1]), x)


def test_expert_stacks_whose_rows_do_not_divide_into_groups_stay_float():
    model, names = quantized_copy(ExpertStack(), "int4", 128)
    assert names == [] and isinstance(model.gate_up_proj, torch.nn.Parameter)


class AttentionPool(torch.nn.Module):
    """SigLIP's pooling head: ``nn.MultiheadAttention`` reads its ``out_proj``'s weight itself."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(64, 2, batch_first=True)
        self.up = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.up(self.attention(x, x, x, need_weights=False)[0])


@pytest.mark.parametrize("scheme", ["int4", "mxfp8"])
def test_multihead_attention_keeps_the_projection_it_reads_itself_float(scheme, tmp_path):
    torch.manual_seed(0)
    model, x = AttentionPool().eval(), torch.randn(1, 5, 64)
    result = etmlx.export(model, (x,), tmp_path / "pool.pte", quantize=scheme, group_size=32)
    assert result.quantized == ("up",) and result.report.fully_delegated
    (delegate,) = inspect_program(result.path)["methods"]["forward"]["delegates"]
    assert delegate["nodes"].count("QuantizedMatmul") == 1 and "Sdpa" in delegate["nodes"]
    reference, _ = quantized_copy(model, scheme, 32)
    with torch.no_grad():
        assert_close(runtimes.load(result.path).forward(x), reference(x))


def test_a_mixed_recipe_gives_value_down_and_head_layers_more_bits():
    """mixed_4_6 as mlx-lm's recipe picks (llama.cpp's Q4_K_M): 6 bits for the head, and
    for v_proj and down_proj of the first and last eighth of 8 layers and every third
    between (layers 0, 3, 6, 7); 4 bits elsewhere, the embedding included. (Each width
    runs on both runtimes in ``test_quantized_layers_run_on_mlx_kernels``.)"""
    from examples import llm

    quantized, names = quantized_copy(llm.tiny_llama(layers=8, hidden=64), "mixed_4_6", 32)
    layers = dict(quantized.named_modules())
    widths = {name: (int(layers[name].weight.qdata.max()) + 1).bit_length() for name in names}  # 2^(bits-1)
    expected = {f"model.layers.{i}.{part}" for i in (0, 3, 6, 7) for part in ("self_attn.v_proj", "mlp.down_proj")}
    assert {name for name, width in widths.items() if width == 6} == expected | {"lm_head"}
    assert {width for name, width in widths.items() if name not in expected | {"lm_head"}} == {4}
    assert "model.embed_tokens" in names
    # what the export reports, per layer
    assert formats(quantized, names) == {name: f"int{widths[name]}, groups of 32" for name in names}


def test_a_mixed_recipe_needs_decoder_layers():
    with pytest.raises(ExportError, match="no down_proj"):
        quantized_copy(Layers(), "mixed_4_6", 32)


def _exportable_int4(model):
    """``model``'s int4 torchao weights (groups of 32) as ExecuTorch's ExportableInt4Tensor."""
    from executorch.extension.llm.export.int4 import ExportableInt4Tensor

    for layer in (model.embed, model.up, model.down):
        layer.weight = torch.nn.Parameter(
            ExportableInt4Tensor.from_intx_unpacked_to_int8_tensor(layer.weight), requires_grad=False
        )
    return model


def test_executorch_exportable_int4_weights_run_on_mlx_kernels():
    """ExportableInt4Tensor (executorch.extension.llm.export.int4): the linear layers one
    QuantizedMatmul each, the embedding packed rows, no float weight in the file, the
    exportable's own eager kernels' result."""
    model = _exportable_int4(_quantized(CONFIGS["int4-g32"]))
    ids = torch.tensor([[0, 5, 95, 17], [3, 3, 60, 1]])
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul", "Dequantize", "Take"], run_with=[(ids.flip(1),)])
    assert lowered.nodes.count("QuantizedMatmul") == 2 and lowered.nodes.count("Dequantize") == 1
    assert not any(c["dtype"] == "float32" and len(c["shape"]) == 2 and min(c["shape"]) > 32 for c in _constants(lowered))
    assert {w["format"] for d in lowered.delegates for w in d["quantized"]} == {"int4"}


class _Summed(torch.nn.Module):
    """A weight read other than by a layer: summed over its rows."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x):
        return x + self.weight.t().sum(0)


@pytest.mark.parametrize("scheme", ["int4", "mxfp4", "mxfp8", "nvfp4"])
def test_an_exportable_weight_read_otherwise_is_dequantized_whole(scheme):
    """No fusion: the weight dequantized once, at load (NVFP4's per-tensor scale too)."""
    from executorch.extension.llm.export.int4 import ExportableInt4Tensor

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 16)
    if scheme == "int4":
        quantize_(layer, CONFIGS["int4-g32"])
        weight = ExportableInt4Tensor.from_intx_unpacked_to_int8_tensor(layer.weight)
    else:
        weight = quantized_copy(layer, scheme)[0].weight
    lowered = delegated(_Summed(weight), (torch.randn(3, 16),), nodes=["Dequantize"])
    assert "QuantizedMatmul" not in lowered.nodes and ("Mul" in lowered.nodes) == (scheme == "nvfp4")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8", "nvfp4"])
def test_quantize_to_mlx_float_modes_runs_on_their_kernels(scheme, dtype):
    """quantize="mxfp4"|"mxfp8"|"nvfp4": etmlx's Mxfp4Tensor, ExecuTorch's ExportableMXTensor
    and ExportableNVFP4Tensor weights, their linear layers one QuantizedMatmul each in MLX's
    mode of that name, the embedding packed rows, no float weight in the file, the
    exportables' own eager result."""
    torch.manual_seed(0)
    model, names = quantized_copy(Layers().to(dtype).eval(), scheme)
    assert names == ["embed", "up", "down"] and set(formats(model, names).values()) == {scheme}
    ids = torch.tensor([[0, 5, 95, 17], [3, 3, 60, 1]])
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul", "Dequantize", "Take"], run_with=[(ids.flip(1),)])
    assert lowered.nodes.count("QuantizedMatmul") == 2 and lowered.nodes.count("Dequantize") == 1
    assert all(c["dtype"] in ("uint32", "uint8") or len(c["shape"]) < 2 for c in _constants(lowered))
    assert {(w["format"], w["group_size"]) for d in lowered.delegates for w in d["quantized"]} == {
        (scheme, 16 if scheme == "nvfp4" else 32)}


def test_mx_elements_mlx_has_no_mode_for_are_one_clear_error(tmp_path):
    from executorch.extension.llm.export.mx import ExportableMXConfig

    layer = torch.nn.Linear(64, 16)
    quantize_(layer, ExportableMXConfig(elem_dtype=torch.float8_e5m2))
    with pytest.raises(ExportError, match=r"MX elements of torch.float8_e5m2 \(MLX's mxfp8 takes"):
        etmlx.export(layer, (torch.randn(2, 64),), tmp_path / "m.pte")


def _with_fractional_zero_points(model):
    """``model``'s linear weights re-made as a GGUF file's are (``etmlx.llm.gguf_model``):
    scales float16 holds exactly, zero points fractional, ``-8 - minimum / scale`` of a
    float16 minimum."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    generator = torch.Generator().manual_seed(3)
    for layer in (model.up, model.down):
        w = layer.weight
        scale = w.scale.half().float()
        minimum = (torch.rand(scale.shape, generator=generator) * -0.1).half().double()
        zero = (-8 - minimum / scale.double()).float()
        layer.weight = torch.nn.Parameter(IntxUnpackedToInt8Tensor(
            qdata=w.qdata, scale=scale, zero_point=zero, target_dtype=w.target_dtype, block_size=w.block_size,
            dtype=w.dtype, activation_quantization=None), requires_grad=False)
    return model


def test_fractional_zero_points_run_on_mlx_kernels_with_float16_scales_where_exact():
    ids = torch.tensor([[0, 5, 95, 17]])
    plain = delegated(_quantized(CONFIGS["int4-g32"], embeddings=False), (ids,), nodes=["QuantizedMatmul"])
    assert "float16" not in {c["dtype"] for c in _constants(plain)}  # torchao's own scales: float32
    model = _with_fractional_zero_points(_quantized(CONFIGS["int4-g32"], embeddings=False))
    lowered = delegated(model, (ids,), nodes=["QuantizedMatmul"])  # and equal to eager
    assert lowered.nodes.count("QuantizedMatmul") == 2
    assert sum(c["dtype"] == "float16" for c in _constants(lowered)) == 4  # the scales and biases of both


def test_every_quantized_rule_ran():
    assert untested_rules("quantized") == set() and untested_rules("exportables") == set()


@pytest.mark.parametrize("scheme, group_size, dtype", [
    ("int4", 32, torch.float32), ("int2", 64, torch.bfloat16), ("int3", 32, torch.float16),
    ("int6", None, torch.float32), ("int8", 128, torch.bfloat16),
])
def test_quantize_makes_what_torchaos_config_makes(scheme, group_size, dtype, monkeypatch):
    """``quantize`` computes a weight in blocks of rows with torchao's ``choose_qparams_affine``
    and its ``quantize_affine``'s arithmetic, op for op (here blocks of 3 rows): qdata,
    scales and zero points equal to what
    ``IntxWeightOnlyConfig`` makes of the whole weight, linear and embedding alike."""
    from etmlx.quant import intx, weights as quantization

    monkeypatch.setattr(intx, "ROWS_AT_ONCE_VALUES", 3 * 128)
    for layer in (torch.nn.Linear(128, 10), torch.nn.Embedding(11, 128)):
        layer = layer.to(dtype)
        with torch.no_grad():  # a row of zeros (the smallest scale), one of large values, halves to round
            layer.weight[0] = 0
            layer.weight[1] *= 1000
            layer.weight[2] = torch.arange(128) % 16 - 7.5
        reference = copy.deepcopy(layer)
        granularity = PerAxis(0) if group_size is None else PerGroup(group_size)
        quantize_(reference, IntxWeightOnlyConfig(weight_dtype=getattr(torch, scheme), granularity=granularity),
                  filter_fn=lambda candidate, _: True)
        quantization.quantize(layer, scheme, group_size)
        for part in ("qdata", "scale", "zero_point"):
            assert torch.equal(getattr(layer.weight, part), getattr(reference.weight, part)), part
        assert (layer.weight.block_size, layer.weight.dtype) == (tuple(reference.weight.block_size), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bits, group_size", [(2, 32), (4, 64), (8, 256)])
def test_symmetric_biases_are_the_float64_ones(dtype, bits, group_size):
    """Without zero points (a symmetric quantization's), ``mlx_scales`` computes the biases
    ``-scale * 2**(bits - 1)`` in the scales' dtype: the float64 product rounded to it,
    down to the sign of zero and the overflow to infinity."""
    from etmlx.lowering.rules.quantized import _mlx_group_size, mlx_scales

    scale = (torch.rand(16, 8) * 10.0 ** torch.randint(-30, 3, (16, 8))).to(dtype)
    scale[0, :3] = torch.tensor([torch.finfo(dtype).max, torch.finfo(dtype).tiny, 0])
    repeat = group_size // _mlx_group_size(group_size)
    expected = (-scale.double() * 2 ** (bits - 1)).repeat_interleave(repeat, -1).to(dtype)
    for zero_point in (None, torch.zeros(16, 8, dtype=torch.int8)):
        scales, biases = mlx_scales(scale, zero_point, group_size, bits, dtype)
        assert torch.equal(scales, scale.repeat_interleave(repeat, -1))
        assert torch.equal(biases, expected) and torch.equal(biases.signbit(), expected.signbit())
        assert biases[0, 0] == -torch.inf
