"""A GGUF file (llama.cpp's format) as a transformers causal LM whose linear and
embedding layers hold the file's quantized weights, in torchao's form
(``IntxUnpackedToInt8Tensor``), which etmlx lowers to MLX's quantized kernels.

transformers reads the architecture, hyperparameters and tokenizer from the file's
metadata; its own load (``load_gguf_checkpoint``) dequantizes every tensor, and that
float model is what the file computes. Here the model is made without weights and each
tensor is set in turn: a float one as transformers' load sets it, a quantized one read
from its blocks as MLX's affine form, ``w = scale * q + bias`` per group of 32 values of
a row:

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one fp16 scale (and for _1 a minimum) per block of 32;
- Q4_K, Q5_K: per sub-block of 32, ``d * sc`` and ``-dmin * m`` (ExecuTorch's field
  decoders, ``executorch.extension.llm.export.gguf``);
- Q6_K: sub-blocks of 16, which MLX's groups (32, 64, 128) take only where each pair
  shares its scale in every row.

A tensor is kept quantized only where that form, with transformers' own row order (its
loader un-permutes Llama's query and key rows), dequantizes to the weight transformers'
load would hold (gguf's ``dequantize``, which it calls): a decoding that disagreed would be a wrong number, so such a tensor (and every
type without an exact MLX layout: Q2_K, Q3_K, the IQ and TQ types) runs on its
dequantized weight instead, named with the reason in ``GgufModel.declined``.
"""

import contextlib
import os
import re
from dataclasses import dataclass, field

import numpy as np

from etmlx.errors import ExportError, first_line

GROUP = 32  # the values of a row sharing one scale in every layout kept quantized
# type name -> bits, for the blocks of 32 values: d (fp16), [m (fp16)], [qh (4 bytes)], qs
_LEGACY = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8}
_K_QUANTS = {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6}
BITS = {**_LEGACY, **_K_QUANTS}  # the types kept quantized, and their widths on MLX
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass
class GgufModel:
    """``model`` (eval mode), its ``tokenizer``, the format each quantized layer runs in
    (``{module name: "Q4_K as int4, groups of 32"}``) and the tensors left float with why."""

    model: object
    tokenizer: object
    formats: dict = field(default_factory=dict)
    declined: dict = field(default_factory=dict)


def is_gguf(path) -> bool:
    return os.fspath(path).lower().endswith(".gguf")


def load(path, dtype, deferred: bool = False) -> GgufModel:
    """The causal LM in the GGUF file ``path``, its weights and activations in ``dtype``.

    The model is made without weights and each tensor of the file is read, converted and
    set in turn (the file stays memory-mapped; its pages are given back after each
    read), so that the process holds the model it returns and one tensor's work, never
    the whole file dequantized. ``deferred``: a quantized weight's integer values are
    computed from the file's blocks when lowering packs them (``lowering/deferred.py``;
    inside its ``scope()``)."""
    reader = _reader(path)
    folder, name = os.path.split(os.path.abspath(path))
    architecture = reader.get_field("general.architecture")
    if architecture is None:
        raise ExportError(f"{path}: its metadata names no architecture (general.architecture)")
    with _parsed_once(reader):
        model, parsed, processor = _empty_model(path, folder, name, architecture.contents(), dtype)
        tokenizer = _tokenizer(folder, name)
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    tensor_names = get_gguf_hf_weights_map(model, processor)
    modules = dict(model.named_modules())
    result = GgufModel(model, tokenizer)
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        source = f"{path} ({tensor.name})"
        if kind not in FLOAT_TYPES and _set_quantized(result, tensor, kind, processor, tensor_names, modules, dtype,
                                                      deferred, source):
            continue
        _set_float(model, tensor, processor, tensor_names, parsed, source)
    for hf_name, value in parsed["tensors"].items():  # what a processor gathered (merged experts)
        _set(model, hf_name, value, path)
    missing = [key for key, value in _tensors(model) if value.is_meta]
    if missing:
        raise ExportError(f"{path}: its tensors do not make a {type(model).__name__}: missing {missing[:4]}"
                          f"{f' and {len(missing) - 4} more' if len(missing) > 4 else ''}")
    return result


def _set_quantized(result, tensor, kind, processor, tensor_names, modules, dtype, deferred, source: str) -> bool:
    """Sets ``tensor``'s layer's weight to its quantized blocks where they run on MLX as
    they are (``_quantized_weight``); whether it did (else why not is in ``declined``)."""
    import torch

    processed, order = _processed(tensor, processor)
    hf_name = tensor_names.get(processed)
    module_name = hf_name.removesuffix(".weight") if hf_name and hf_name.endswith(".weight") else None
    layer = modules.get(module_name)
    if not isinstance(layer, (torch.nn.Linear, torch.nn.Embedding)):
        result.declined[hf_name or tensor.name] = (
            f"{kind}: not the weight of a linear or embedding layer of transformers' model"
            f"{'' if hf_name else ' (which has no such tensor)'}; runs as transformers loads it")
        return False
    quantized, reason = _quantized_weight(tensor, kind, tuple(layer.weight.shape), order, processor, dtype,
                                          deferred)
    if reason:
        result.declined[hf_name] = f"{kind}: {reason}; runs on the dequantized weight"
        return False
    _set(result.model, hf_name, quantized, source)
    result.formats[module_name] = f"{kind} as int{BITS[kind]}, groups of {quantized.block_size[-1]}"
    return True


def _set_float(model, tensor, processor, tensor_names, parsed, source: str) -> None:
    """Sets ``tensor`` as transformers' own GGUF load does (``load_gguf_checkpoint``):
    dequantized, processed, converted to the parameter's dtype."""
    import torch
    from gguf import dequantize

    from etmlx.lowering.mapped_pages import release

    result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                               tensor_key_mapping=tensor_names, parsed_parameters=parsed)
    release(tensor.data)
    if result.name in tensor_names:
        _set(model, tensor_names[result.name], torch.from_numpy(np.copy(result.weights)), source)


def _set(model, hf_name: str, value, source: str) -> None:
    """``model``'s parameter (or buffer) ``hf_name``, and every one tied to it, becomes
    ``value`` in its dtype; a value of another shape is refused, naming both."""
    import torch

    owner, _, leaf = hf_name.rpartition(".")
    holder = model.get_submodule(owner)
    current = holder._parameters.get(leaf, holder._buffers.get(leaf))
    if current is None:
        raise ExportError(f"{source}: {type(model).__name__} has no tensor {hf_name}")
    if tuple(value.shape) != tuple(current.shape):
        raise ExportError(f"{source}: its tensors do not make a {type(model).__name__}: {hf_name} is "
                          f"{tuple(value.shape)} in the file, {tuple(current.shape)} in the model")
    if value.dtype != current.dtype and not hasattr(value, "qdata"):
        value = value.to(current.dtype)
    if leaf in holder._buffers:
        holder._buffers[leaf] = value
        return
    parameter = torch.nn.Parameter(value, requires_grad=False)
    for module in model.modules():
        for key, held in module._parameters.items():
            if held is current:
                module._parameters[key] = parameter


def _tensors(model):
    """(name, tensor) of every parameter and buffer, tied ones under each of their names."""
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _reader(path):
    try:
        import gguf
    except ImportError as error:
        raise ExportError(f"{path}: reading GGUF files needs the gguf package (pip install 'etmlx[gguf]')") from error
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, EOFError) as error:
        unknown = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", str(error))
        reason = f"a tensor of unknown type {unknown.group(1)}" if unknown else \
            f"truncated or damaged ({first_line(error)})"
        raise ExportError(f"{path}: not a valid GGUF file: {reason}") from error


def _empty_model(path, folder, name, architecture: str, dtype):
    """transformers' model of the file, its parameters on the meta device (buffers such
    as rotary frequencies real), tied as the config says; the metadata transformers
    parsed (its ``tensors`` for what a processor gathers); and the tensor processor."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, load_gguf_checkpoint

    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        with _parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        parsed = load_gguf_checkpoint(path, return_tensors=False)
    except (ValueError, KeyError, NotImplementedError, OSError) as error:
        raise ExportError(f"transformers cannot load {path} as a causal LM: {first_line(error)}") from error
    model.tie_weights()
    parsed["tensors"] = {}
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    return model.eval(), parsed, processor


@contextlib.contextmanager
def _parsed_once(reader):
    """transformers' config, metadata and tokenizer loads each parse the file again with
    their own ``gguf.GGUFReader`` (8 s apiece for a 128k-token vocabulary: a Python
    loop over every string); inside, they are given ``reader``, parsed already."""
    import gguf

    parse = gguf.GGUFReader

    def parsed(path, *args, **kwargs):
        same = os.path.abspath(path) == os.path.abspath(reader.data.filename) and not args and not kwargs
        return reader if same else parse(path, *args, **kwargs)

    gguf.GGUFReader = parsed
    try:
        yield
    finally:
        gguf.GGUFReader = parse


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules made inside hold their parameters on the meta device (no memory, and
    their initializers do nothing); buffers are made as usual."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module, name, parameter):
        if parameter is not None:
            parameter = torch.nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)
        register(module, name, parameter)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _tokenizer(folder, name):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, OSError) as error:
        path = os.path.join(folder, name)
        raise ExportError(f"{path}: transformers cannot read its tokenizer: {first_line(error)}") from error


def _quantized_weight(tensor, kind: str, shape: tuple, order, processor, dtype, deferred: bool):
    """(IntxUnpackedToInt8Tensor, None) for ``tensor`` of type ``kind``, a ``shape``
    weight whose rows are the file's in ``order`` (transformers' ``processor``'s); or
    (None, why it stays float). Its blocks are decoded a block of rows at a time and
    compared with gguf's own dequantization, which transformers loads (the order checked
    on the first values of each row, processed as transformers processes the tensor);
    the integer values are decoded again when read (``deferred``: when lowering packs
    them)."""
    import torch
    from gguf import GGML_QUANT_SIZES, dequantize
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from etmlx.lowering import deferred as deferred_constants
    from etmlx.lowering.context import stored
    from etmlx.lowering.mapped_pages import release
    from etmlx.lowering.rules.quantized import packed_form, packed_words
    from etmlx.quant.intx import row_blocks

    if kind not in BITS:
        return None, f"no exact layout in MLX's quantized kernels (etmlx runs {', '.join(BITS)})"
    if tuple(int(size) for size in reversed(tensor.shape)) != shape:  # GGUF lists the innermost first
        return None, f"{tuple(reversed(tensor.shape))} in the file, {shape} in the model"
    if order is None:
        return None, "transformers' loader reshapes this tensor beyond reordering its rows"
    rows, columns = shape
    raw = np.asarray(tensor.data).reshape(rows, -1)
    order, blocks, eps = order.numpy(), row_blocks(rows, columns), torch.finfo(dtype).eps
    values, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
    # transformers' processor on the first block of each row: the rows' order, checked on values
    firsts = np.asarray(_process(processor, tensor.name, dequantize(raw[:, :block_bytes], tensor.tensor_type)).weights)
    differ = "its blocks, decoded for MLX, differ from the weight transformers loads"
    scales, biases = [], []
    for rows_ in blocks:
        block = raw[order[rows_]]
        fields = _fields(torch.from_numpy(block), kind, len(block), columns)
        if isinstance(fields, str):
            return None, fields
        unsigned, scale, bias, bits = fields
        decoded = scale.repeat_interleave(GROUP, -1) * unsigned + bias.repeat_interleave(GROUP, -1)
        dequantized = dequantize(block, tensor.tensor_type)
        if not np.array_equal(dequantized[:, :values], firsts[rows_]):
            return None, differ
        expected = torch.from_numpy(dequantized).to(dtype).float()
        if not torch.allclose(decoded, expected, rtol=eps, atol=eps * float(expected.abs().max())):
            return None, differ
        scales.append(scale)
        biases.append(bias)
    release(raw)
    offset = 2 ** (bits - 1)
    scale, bias = torch.cat(scales), torch.cat(biases)
    constant = scale == 0  # w = bias throughout: any scale with q = 0 computes it
    scale = torch.where(constant, torch.ones_like(scale), scale)
    zero_point = -offset - bias.double() / scale.double()

    def integers_of(rows_):
        block = raw[order[rows_]]
        unsigned = _fields(torch.from_numpy(block), kind, len(block), columns)[0]
        return (torch.where(constant[rows_].repeat_interleave(GROUP, -1), 0, unsigned) - offset).to(torch.int8)

    def decoded(width: int, dtype, form=lambda values: values):
        """``form`` of the integer values (of ``width`` columns), a block of rows at a time."""
        result = torch.empty(rows, width, dtype=dtype)
        for rows_ in blocks:
            result[rows_] = form(integers_of(rows_))
        release(raw)
        return result

    def integers():
        return decoded(columns, torch.int8)

    def packed():  # never the whole matrix of integers (an embedding's: 0.25 GB at 1B)
        return stored(decoded(columns * bits // 32, torch.int32,
                              lambda values: packed_words(values, bits).view(torch.int32)).view(torch.uint32))

    if not deferred:
        qdata = integers()
    else:
        qdata = deferred_constants.placeholder(shape, torch.int8, integers)
        deferred_constants.offer(qdata, packed_form(bits), packed)  # what lowering packs, read by rows
    weight = IntxUnpackedToInt8Tensor(
        qdata=qdata, scale=scale.to(dtype), zero_point=zero_point.to(dtype), target_dtype=getattr(torch, f"int{bits}"),
        block_size=(1, GROUP), dtype=dtype, activation_quantization=None)
    return weight, None


def _processed(tensor, processor):
    """(the name transformers' processor gives ``tensor``, the order it puts the file's
    rows in (it un-permutes Llama's query and key heads) or None where it does more
    than reorder rows), found by processing the row numbers."""
    import torch

    rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1  # GGUF lists dimensions innermost first
    try:
        result = _process(processor, tensor.name, np.arange(rows, dtype=np.float64)[:, None])
    except (ValueError, IndexError, KeyError, TypeError):  # a processor that splits or merges tensors
        return tensor.name, None
    processed = np.asarray(result.weights)
    if processed.shape != (rows, 1) or sorted(processed[:, 0].tolist()) != list(range(rows)):
        return result.name, None
    return result.name, torch.from_numpy(processed[:, 0].astype(np.int64))


def _process(processor, name: str, weights):
    """What transformers' ``processor`` makes of the file's tensor ``name`` were it
    ``weights``, without the bookkeeping of a whole load."""
    return processor.process(weights=weights, name=name, tensor_key_mapping={},
                             parsed_parameters={"tensors": {}, "config": {}})


def _fields(raw, kind: str, rows: int, columns: int):
    """``(q unsigned (rows, columns), scale, bias (rows, columns / 32) float32, bits)``
    with ``w = scale * q + bias``; or why these blocks have no such form."""
    import torch

    if kind in _LEGACY:
        return _legacy_fields(raw.reshape(-1, raw.shape[-1] * GROUP // columns), kind, rows, columns)
    from executorch.extension.llm.export import gguf as executorch_gguf  # its block decoders

    if kind == "Q6_K":
        signed, scale = executorch_gguf._q6_k_fields(raw, rows, columns)  # groups of 16
        if not bool((scale[:, 0::2] == scale[:, 1::2]).all()):
            return "sub-blocks of 16 values with scales of their own (MLX's groups hold 32 or more)"
        scale = scale[:, 0::2].contiguous()
        return signed.to(torch.int16) + 32, scale, -32 * scale, 6
    decode = executorch_gguf._q4_k_fields if kind == "Q4_K" else executorch_gguf._q5_k_fields
    unsigned, scale, minimum = decode(raw, rows, columns)
    return unsigned.to(torch.int16), scale, -minimum, _K_QUANTS[kind]


def _legacy_fields(blocks, kind: str, rows: int, columns: int):
    """Blocks of 32 values: ``d`` (fp16), ``m`` (fp16, the _1 types), ``qh`` (the fifth
    bits, the 5-bit types), then the low nibbles (values 0-15 low, 16-31 high) or, Q8_0,
    32 int8 values."""
    import torch

    bits = _LEGACY[kind]
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()
    if kind == "Q8_0":
        values = blocks[:, 2:34].contiguous().view(torch.int8).to(torch.int16) + 128
        return values.reshape(rows, columns), d.reshape(rows, -1), (-128 * d).reshape(rows, -1), bits
    has_min = kind.endswith("_1")
    m = blocks[:, 2:4].contiguous().view(torch.float16).float() if has_min else None
    start = 4 if has_min else 2
    if bits == 5:
        qh = blocks[:, start:start + 4].to(torch.int64)
        high = (qh[:, 0:1] | qh[:, 1:2] << 8 | qh[:, 2:3] << 16 | qh[:, 3:4] << 24) >> torch.arange(32) & 1
        start += 4
    qs = blocks[:, start:start + 16].to(torch.int16)
    values = torch.cat([qs & 0x0F, qs >> 4], dim=1)
    if bits == 5:
        values = values | (high.to(torch.int16) << 4)
    bias = m if has_min else -(2 ** (bits - 1)) * d
    return values.reshape(rows, columns), d.reshape(rows, -1), bias.reshape(rows, -1), bits
