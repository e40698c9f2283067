"""A KV cache quantized as MLX quantizes it (mlx-lm's ``--kv-bits``): each position's key
and value, per head, is held as ``bits``-bit values in groups of ``group_size`` along
the head dim, with a scale and a bias per group (``mx.quantize``'s affine layout), and
attention computes on the packed cache (``mx.quantized_matmul``), as mlx-lm's quantized
attention does. At 8 bits a cache takes a bit over a quarter of its float32 size, at 4
bits about an eighth.

Only full-attention layers are quantized: a sliding layer's ring (``sliding_cache``)
holds a window, not the context, and stays float, as mlx-lm keeps its rotating caches.
The export's eager module computes with the same quantization (the custom ops' eager
kernels reproduce MLX's), so the runtimes are checked against it exactly; what
quantization itself costs is the difference from the float cache's logits, measured in
the tests and the bench."""

import torch
from transformers.cache_utils import StaticCache, StaticLayer

from etmlx.errors import ExportError
from etmlx.serializer.constants import QUANTIZED_GROUP_SIZES
from etmlx.lowering import custom_ops  # noqa: F401  (registers torch.ops.etmlx)
from etmlx.lowering.rules.quantized_cache import check_cache_quantization

PARTS = ("cache", "scales", "biases")  # the buffers of each of keys and values: key_cache_0, key_scales_0, ...


class QuantizedLayer(StaticLayer):
    """A full-attention layer's cache of ``capacity`` positions held quantized:
    ``key_parts`` and ``value_parts`` are (int32 packed words, scales, biases), each
    ``[batch, heads, capacity, ...]``. ``update`` quantizes and writes the call's keys and
    values and returns the packed words, which only ``attention`` reads."""

    def __init__(self, like: StaticLayer, group_size: int, bits: int):
        super().__init__(max_cache_len=like.max_cache_len)
        self.group_size, self.bits = group_size, bits
        self.key_parts = _zero_parts(like.keys, group_size, bits)
        self.value_parts = _zero_parts(like.values, group_size, bits)
        self.keys, self.values = self.key_parts[0], self.value_parts[0]
        # what transformers reads of an initialized StaticLayer
        self.dtype, self.device = like.keys.dtype, like.keys.device
        self.batch_size, self.num_heads = like.keys.shape[:2]
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        count = key_states.shape[-2]
        positions = torch.arange(count) + self.cumulative_length
        self.cumulative_length.add_(count)  # as StaticLayer does
        for parts, states in ((self.key_parts, key_states), (self.value_parts, value_states)):
            for part, written in zip(parts, torch.ops.etmlx.quantize(states, self.group_size, self.bits)):
                part.index_copy_(2, positions, written)
        return self.keys, self.values

    def attention(self, query, attention_mask, window, scaling):
        """Attention of ``query`` (``[batch, heads, n, head_dim]``) over the first
        ``window`` positions of the cache, ``attention_mask`` over those: mlx-lm's
        quantized attention (heads grouped over their kv head, scores in the query's
        dtype, softmax in float32). Returns ``[batch, n, heads, head_dim]``."""
        batch, heads, length, dim = query.shape
        kv_heads = self.keys.shape[1]
        # slice_copy, not a view: a view's contiguity would make torch.export specialize on the window
        keys, values = ([torch.ops.aten.slice_copy.Tensor(p, 2, 0, window).unsqueeze(2) for p in parts]
                        for parts in (self.key_parts, self.value_parts))
        grouped = (query * scaling).reshape(batch, kv_heads, heads // kv_heads, length, dim)
        scores = torch.ops.etmlx.quantized_matmul(grouped, *keys, True, self.group_size, self.bits)
        mask = attention_mask.unsqueeze(2)
        if mask.dtype == torch.bool:
            scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
        weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        out = torch.ops.etmlx.quantized_matmul(weights, *values, False, self.group_size, self.bits)
        return out.reshape(batch, heads, length, out.shape[-1]).transpose(1, 2).contiguous()


def _zero_parts(like: torch.Tensor, group_size: int, bits: int) -> tuple:
    *leading, dim = like.shape
    groups = (*leading, dim // group_size)
    return (torch.zeros((*leading, dim * bits // 32), dtype=torch.int32),
            torch.zeros(groups, dtype=like.dtype), torch.zeros(groups, dtype=like.dtype))


def quantize_layers(module, static_cache: StaticCache, bits, group_size: int, skip) -> dict:
    """``{layer index: QuantizedLayer}``: ``static_cache``'s layers (all but ``skip``)
    quantized to ``bits`` (None: none), their buffers registered on ``module`` by the
    static cache's names (``key_cache_0``: the packed keys; ``key_scales_0``, ...;
    ``cumulative_length_0``)."""
    if bits is None:
        return {}
    reason = check_cache_quantization(group_size, bits)
    if reason:
        raise ExportError(f"kv_bits={bits}, kv_group_size={group_size}: {reason}")
    layers = {}
    for index, layer in enumerate(static_cache.layers):
        if index in skip:
            continue
        for states in (layer.keys, layer.values):
            width = states.shape[-1]
            if width % group_size:
                fitting = [str(g) for g in QUANTIZED_GROUP_SIZES if width % g == 0]
                hint = f"try {' or '.join(fitting)}" if fitting else "MLX's groups of 32, 64 or 128 need heads of a " \
                    "multiple of 32; export without kv_bits"
                raise ExportError(f"kv_group_size={group_size}: layer {index}'s heads are {width} wide, not a "
                                  f"multiple of it ({hint})")
        static_cache.layers[index] = layers[index] = QuantizedLayer(layer, group_size, bits)
        for kind, parts in (("key", layers[index].key_parts), ("value", layers[index].value_parts)):
            for part, tensor in zip(PARTS, parts):
                module.register_buffer(f"{kind}_{part}_{index}", tensor, persistent=False)
        module.register_buffer(f"cumulative_length_{index}", layers[index].cumulative_length, persistent=False)
    return layers
