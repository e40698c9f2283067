"""A GGUF file (llama.cpp's format) as a transformers causal LM whose linear and
embedding layers hold the file's quantized weights, in torchao's form
(``IntxUnpackedToInt8Tensor``), which etmlx lowers to MLX's quantized kernels.

transformers reads the architecture, hyperparameters and tokenizer from the file's
metadata and dequantizes every tensor (``load_gguf_checkpoint``): that float model is
what the file computes. Each quantized tensor is then read again from its blocks as
MLX's affine form, ``w = scale * q + bias`` per group of 32 values of a row:

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: one fp16 scale (and for _1 a minimum) per block of 32;
- Q4_K, Q5_K: per sub-block of 32, ``d * sc`` and ``-dmin * m`` (ExecuTorch's field
  decoders, ``executorch.extension.llm.export.gguf``);
- Q6_K: sub-blocks of 16, which MLX's groups (32, 64, 128) take only where each pair
  shares its scale in every row.

A tensor is kept quantized only where that form, with transformers' own row order (its
loader un-permutes Llama's query and key rows), dequantizes to the weight transformers
loaded: a decoding that disagreed would be a wrong number, so such a tensor (and every
type without an exact MLX layout: Q2_K, Q3_K, the IQ and TQ types) runs on its
dequantized weight instead, named with the reason in ``GgufModel.declined``.
"""

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


def load(path, dtype) -> GgufModel:
    """The causal LM in the GGUF file ``path``, its weights and activations in ``dtype``."""
    import torch

    reader = _reader(path)
    folder, name = os.path.split(os.path.abspath(path))
    architecture = reader.get_field("general.architecture")
    if architecture is None:
        raise ExportError(f"{path}: its metadata names no architecture (general.architecture)")
    model, tensor_names, processor = _float_model(path, folder, name, architecture.contents(), dtype)
    modules = dict(model.named_modules())
    result = GgufModel(model, _tokenizer(folder, name))
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind in FLOAT_TYPES:
            continue
        processed, order = _processed(tensor, processor)
        hf_name = tensor_names.get(processed)
        module_name = hf_name.removesuffix(".weight") if hf_name and hf_name.endswith(".weight") else None
        layer = modules.get(module_name)
        if not isinstance(layer, (torch.nn.Linear, torch.nn.Embedding)):
            result.declined[hf_name or tensor.name] = (
                f"{kind}: not the weight of a linear or embedding layer of transformers' model"
                f"{'' if hf_name else ' (which has no such tensor)'}; runs as transformers loads it")
            continue
        quantized, reason = _quantized_weight(tensor, kind, layer.weight, order, dtype)
        if reason:
            result.declined[hf_name] = f"{kind}: {reason}; runs on the dequantized weight"
            continue
        weight = torch.nn.Parameter(quantized, requires_grad=False)
        for tied in _sharing(model, layer.weight):
            tied.weight = weight
        result.formats[module_name] = f"{kind} as int{BITS[kind]}, groups of {quantized.block_size[-1]}"
    return result


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


def _float_model(path, folder, name, architecture: str, dtype):
    """transformers' model of the file, every tensor dequantized into it, and its map
    from (processed) GGUF tensor names to the model's, with the processor that made it."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint)

    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        parsed = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model, torch_dtype=dtype)
    except (ValueError, KeyError, NotImplementedError, OSError) as error:
        raise ExportError(f"transformers cannot load {path} as a causal LM: {first_line(error)}") from error
    try:
        missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    except RuntimeError as error:  # a tensor of another shape than the metadata gives
        raise ExportError(f"{path}: its tensors do not make a {type(model).__name__}: {first_line(error)}") from error
    missing = [key for key in missing if not _tied_or_derived(model, key)]
    if missing or unexpected:
        raise ExportError(f"{path}: its tensors do not make a {type(model).__name__}: missing {missing[:4]}, "
                          f"unexpected {unexpected[:4]}")
    model.tie_weights()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    return model.eval(), get_gguf_hf_weights_map(model, processor), processor


def _tied_or_derived(model, key: str) -> bool:
    """Whether a parameter the file need not hold: a head tied to the embedding, or a
    buffer the model computes (rotary frequencies)."""
    tied_keys = getattr(model, "_tied_weights_keys", None) or {}
    return (getattr(model.config, "tie_word_embeddings", False) and key in tied_keys) or "rotary" in key


def _tokenizer(folder, name):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, OSError) as error:
        path = os.path.join(folder, name)
        raise ExportError(f"{path}: transformers cannot read its tokenizer: {first_line(error)}") from error


def _sharing(model, weight) -> list:
    """The modules whose ``weight`` is ``weight`` (an embedding and a head tied to it)."""
    return [m for m in model.modules() if getattr(m, "weight", None) is weight]


def _quantized_weight(tensor, kind: str, loaded, order, dtype):
    """(IntxUnpackedToInt8Tensor, None) for ``tensor`` of type ``kind``, its rows taken in
    ``order``, the order of the weight transformers ``loaded``; or (None, why it stays float)."""
    import torch
    from torchao.quantization import IntxUnpackedToInt8Tensor

    rows, columns = loaded.shape
    if kind not in BITS:
        return None, f"no exact layout in MLX's quantized kernels (etmlx runs {', '.join(BITS)})"
    raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(rows, -1))
    if order is None:
        return None, "transformers' loader reshapes this tensor beyond reordering its rows"
    fields = _fields(raw[order], kind, rows, columns)
    if isinstance(fields, str):
        return None, fields
    unsigned, scale, bias, bits = fields
    decoded = scale.repeat_interleave(GROUP, -1) * unsigned + bias.repeat_interleave(GROUP, -1)
    expected = loaded.detach().float()
    eps = torch.finfo(dtype).eps
    if not torch.allclose(decoded, expected, rtol=eps, atol=eps * float(expected.abs().max())):
        return None, "its blocks, decoded for MLX, differ from the weight transformers loaded"
    offset = 2 ** (bits - 1)
    constant = scale == 0  # w = bias throughout: any scale with q = 0 computes it
    scale = torch.where(constant, torch.ones_like(scale), scale)
    unsigned = torch.where(constant.repeat_interleave(GROUP, -1), torch.zeros_like(unsigned), unsigned)
    zero_point = -offset - bias.double() / scale.double()
    weight = IntxUnpackedToInt8Tensor(
        qdata=(unsigned - offset).to(torch.int8), scale=scale.to(dtype), zero_point=zero_point.to(dtype),
        target_dtype=getattr(torch, f"int{bits}"), block_size=(1, GROUP), dtype=dtype, activation_quantization=None)
    return weight, None


def _processed(tensor, processor):
    """(the name transformers' processor gives ``tensor``, the order it puts the file's
    rows in (it un-permutes Llama's query and key heads) or None where it does more
    than reorder rows), found by processing the row numbers."""
    import torch

    rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1  # GGUF lists dimensions innermost first
    numbers = np.arange(rows, dtype=np.float64)[:, None]
    try:
        result = processor.process(weights=numbers, name=tensor.name, tensor_key_mapping={},
                                   parsed_parameters={"tensors": {}, "config": {}})
    except (ValueError, IndexError, KeyError, TypeError):  # a processor that splits or merges tensors
        return tensor.name, None
    processed = np.asarray(result.weights)
    if processed.shape != (rows, 1) or sorted(processed[:, 0].tolist()) != list(range(rows)):
        return result.name, None
    return result.name, torch.from_numpy(processed[:, 0].astype(np.int64))


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
