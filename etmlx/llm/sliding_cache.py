"""Sliding-window attention layers (Mistral's, Gemma 2 and 3's local layers) over a ring
of ``W + R`` cache slots instead of the whole context.

transformers' exportable static cache gives a sliding layer a cache of the whole context
(its ring layer branches on a Python int, which a trace cannot follow) and relies on the
mask to hide what the window excludes. Here such a layer keeps ``W + R`` slots: position
``p`` is written to slot ``p % (W + R)``, and a call attends over the ring as it was
before the call followed by the call's own keys, with a mask built from the position
each slot holds: slot ``j`` holds the last position before ``end`` (where the last call
stopped) that is ``j`` modulo ``W + R``. A key is read when it was written before this
call (or by it), is not after the query, and lies inside the window: exactly the keys
transformers' sliding mask admits, so the logits are eager's. Keys carry their rotary
embedding, and attention is a sum over keys, so the ring's order does not matter.

``R`` is the rewind the ring allows: a call may start up to ``R`` positions before the
last call's end (a chat turn that re-reads the previous reply; R is the export's
``max_seq_len``), or at 0; anything else would read slots the ring has overwritten, and
the graph checks it (an index against ``R + 1``: IndexRangeError, nothing changed). A
call writes at most ``max_seq_len <= R`` positions, so no two of them share a slot."""

from dataclasses import dataclass

import torch
from transformers.cache_utils import StaticCache, StaticLayer, StaticSlidingWindowLayer

from etmlx.errors import ExportError


@dataclass
class RingCall:
    """What a traced call's ring layers share: the slots its positions go to, and the
    mask of its queries over (the ring before the call, then its own keys)."""

    slots: torch.Tensor
    mask: torch.Tensor


class RingLayer(StaticLayer):
    """A sliding layer's cache of ``size`` slots. ``update`` writes the call's keys and
    values at ``call.slots`` and returns the ring as it was, then the call's own: what
    ``RingCall.mask`` is laid out over."""

    is_sliding = True  # transformers builds the full layers' mask over the first layer that is not

    def __init__(self, size: int, like: StaticLayer):
        super().__init__(max_cache_len=size)
        self.lazy_initialization(like.keys[:, :, :0], like.values[:, :, :0])
        self.call = None  # set by the wrapper for the call being traced

    def update(self, key_states, value_states, *args, **kwargs):
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        self.keys.index_copy_(2, self.call.slots, key_states)
        self.values.index_copy_(2, self.call.slots, value_states)
        # As StaticLayer does; it also keeps each layer's length a value of its own (torch.export's
        # verifier miscounts buffers that are all set to the same value)
        self.cumulative_length.add_(key_states.shape[-2])
        return keys, values


class Rings:
    """The ring layers of one wrapped model: which layers, their window ``W`` and the
    rewind ``R`` they allow, and the mask each call attends with."""

    def __init__(self, static_cache: StaticCache, config, capacity: int, rewind: int):
        self.window = getattr(config, "sliding_window", None)
        self.layers = sliding_layers(config, capacity)
        self.size = (self.window or 0) + rewind
        self.rewind = rewind
        self.current = None  # the RingCall of the call being traced
        for index in self.layers:
            static_cache.layers[index] = RingLayer(self.size, static_cache.layers[index])

    def __bool__(self) -> bool:
        return bool(self.layers)

    def call(self, static_cache: StaticCache, start, count, end: torch.Tensor, blocks=None) -> None:
        """The ring call of ``count`` positions from ``start``, the last call having ended
        at ``end`` (a buffer: updated here). ``start`` must be 0 or within ``rewind`` of
        ``end``: the check is an index into ``arange(rewind + 1)``. ``blocks``: the image
        block of each of the call's positions (-1: none), whose tokens also attend to the
        later tokens of their block, inside the window (Gemma 3's image tokens)."""
        back = torch.where(start > 0, end - start, 0).reshape(1)
        back = torch.index_select(torch.arange(self.rewind + 1), 0, back).reshape(())
        held_until = start + back  # the last call's end, or 0 when starting over
        slot = torch.arange(self.size)
        held = held_until - 1 - torch.remainder(held_until - 1 - slot, self.size)  # the position each slot holds
        positions = start + torch.arange(count)
        keys = torch.cat([held, positions])
        written = torch.cat([(held >= 0) & (held < start), torch.ones(count, dtype=torch.bool)])
        query = positions[:, None]
        ordered = keys <= query
        if blocks is not None:  # the ring holds no block of this call: -1 for its slots
            key_blocks = torch.cat([torch.full((self.size,), -1, dtype=blocks.dtype), blocks])
            ordered = ordered | ((blocks[:, None] == key_blocks) & (blocks[:, None] >= 0))
        mask = written & ordered & (query - keys < self.window)
        end.copy_(start + count)
        call = self.current = RingCall(torch.remainder(positions, self.size), mask[None, None])
        for index in self.layers:
            static_cache.layers[index].call = call

    def forget(self, static_cache: StaticCache) -> None:
        """Drops the traced call (set by ``call``)."""
        self.current = None
        for index in self.layers:
            static_cache.layers[index].call = None


def sliding_layers(config, capacity: int) -> list:
    """The layers transformers' static cache would give a sliding window shorter than
    ``capacity`` (the others read the whole context anyway)."""
    reference = StaticCache(max_cache_len=capacity, config=config)
    layers = [i for i, layer in enumerate(reference.layers)
              if isinstance(layer, StaticSlidingWindowLayer) and layer.max_cache_len < capacity]
    if layers and not isinstance(getattr(config, "sliding_window", None), int):
        raise ExportError(f"{type(config).__name__} has sliding layers but no sliding_window size")
    kinds = getattr(config, "layer_types", None) or []
    other = sorted({kinds[i] for i in layers if i < len(kinds) and kinds[i] != "sliding_attention"})
    if layers and (other or getattr(config, "use_bidirectional_attention", False)):
        masking = ", ".join(other) or "bidirectional sliding attention"
        raise ExportError(f"{type(config).__name__}'s {masking} layers mask otherwise than causal sliding-window "
                          "attention, the one etmlx's ring cache computes exactly")
    return layers
