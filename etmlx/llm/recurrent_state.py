"""Layers that keep a recurrent state instead of keys and values -- LFM2's short
convolutions, the gated delta nets of Qwen3.5 and Qwen3-Next, Mamba2's state spaces --
exported with that state as buffers of the MLX delegate, beside the KV caches.

transformers' static cache makes such a layer a ``LinearAttentionLayer`` that allocates
its states on first use and branches on Python flags (first call or not, one token or
many): nothing torch.export can keep. Here each is a ``RecurrentLayer`` whose states are
allocated up front (their shapes from one step on fake tensors, ``attention_probe``) and
always "have a previous state": every call concatenates the stored convolution window
before its own tokens and starts the recurrence from the stored state, so one graph
serves prefill, a later chunk of a long prompt, and decode. A call at position 0 starts a
new sequence from zero states, as transformers starts one (in the graph: ``start_call``).

The recurrences themselves are traced as ``etmlx.llm.recurrent_kernels`` computes them.
"""

import contextlib
import inspect

import torch
from transformers import cache_utils

from etmlx.errors import ExportError

# The text model types whose recurrent layers etmlx exports, and what those layers compute.
FAMILIES = {
    "lfm2": "short convolutions",
    "lfm2_moe": "short convolutions",
    "qwen3_5_text": "gated delta nets",
    "qwen3_5_moe_text": "gated delta nets",
    "qwen3_next": "gated delta nets",
    "mamba2": "Mamba2 state spaces",
    "falcon_h1": "Mamba2 state spaces",
    "granitemoehybrid": "Mamba2 state spaces",
    "bamba": "Mamba2 state spaces",
    "nemotron_h": "Mamba2 state spaces",
    "zamba2": "Mamba2 state spaces",
    "mamba": "Mamba selective state spaces",
    "falcon_mamba": "Mamba selective state spaces",
    "jamba": "Mamba selective state spaces",
}
# Families whose recurrent states only a state-space scan reads, which starts a sequence
# from zeros itself (``recurrent_kernels.state_space_scan``).
SCANNED = tuple(family for family, kind in FAMILIES.items() if kind == "Mamba2 state spaces")
# Families whose model numbers a call's tokens from 0 unless given their positions
# (transformers 5.23's Bamba: its generate passes them; a cache's call does not).
NUMBERS_CALLS_FROM_ZERO = ("bamba",)
# transformers' static-cache layer types that keep a recurrent state; and the one that
# keeps keys and values beside it (Falcon-H1's attention and state space in one layer).
RECURRENT_TYPES = ("conv", "linear_attention")
HYBRID_TYPE = "hybrid"


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its cache by: ``cache_params`` for the pure
    state-space models (Mamba2), ``past_key_values`` for the others."""
    return "cache_params" if "cache_params" in inspect.signature(model.forward).parameters else "past_key_values"


def exported_family(config) -> bool:
    """Whether ``config``'s recurrent layers (if any) are ones etmlx exports."""
    return config.get_text_config().model_type in FAMILIES


class RecurrentLayer(cache_utils.LinearAttentionAndStaticFullAttentionLayer):
    """A cache layer of recurrent states that always exist (``attach`` allocates them), in
    front of a static KV cache of ``max_cache_len`` slots (0: a purely recurrent layer)."""

    supports_early_init = True  # its (empty) keys and values, with the other layers'

    def lazy_initialization(self, *args, **kwargs) -> None:
        if kwargs or len(args) != 2:
            raise ExportError("a recurrent layer's state was not allocated before tracing")
        cache_utils.StaticLayer.lazy_initialization(self, *args)

    def attach(self, conv_states: list, recurrent_states: list) -> None:
        """Takes the state tensors (zeros of their shapes) it keeps from now on."""
        for index, state in enumerate(conv_states):
            self.conv_states[index], self.conv_kernel_size[index] = state, state.shape[-1]
            self.is_conv_states_initialized[index] = self.has_previous_state[index] = True
        for index, state in enumerate(recurrent_states):
            self.recurrent_states[index] = state
            self.is_recurrent_states_initialized[index] = self.has_previous_state[index] = True

    def states(self) -> list:
        return [state for state in (*self.conv_states.values(), *self.recurrent_states.values()) if state is not None]

    def update_conv_state(self, conv_states, state_idx: int = 0, **kwargs):
        """The stored window, then the call's columns; the last window's worth is kept."""
        stored = self.conv_states[state_idx]
        whole = torch.cat([stored, conv_states.to(stored.dtype)], dim=-1)
        stored.copy_(whole[..., -stored.shape[-1]:])
        return whole

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
        stored = self.recurrent_states[state_idx]
        stored.copy_(recurrent_states)
        return stored


@contextlib.contextmanager
def recurrent_static_layers():
    """transformers' static caches made while in the block have ``RecurrentLayer``s where
    they would have ``LinearAttentionLayer``s (and "hybrid" layers, attention and a state
    side by side, keep their KV cache too); a model without attention (Mamba2, whose
    config names no attention heads) gets placeholder head shapes for caches of no slots."""
    from transformers.integrations import executorch

    mapping = cache_utils.STATIC_LAYER_TYPE_MAPPING
    before = {kind: mapping[kind] for kind in (*RECURRENT_TYPES, HYBRID_TYPE)}
    head_shapes = executorch.get_head_shapes
    for kind in RECURRENT_TYPES:
        mapping[kind] = _purely_recurrent
    mapping[HYBRID_TYPE] = RecurrentLayer
    executorch.get_head_shapes = _head_shapes_or_none_read(head_shapes)
    try:
        yield
    finally:
        mapping.update(before)
        executorch.get_head_shapes = head_shapes


@contextlib.contextmanager
def masks_sized_by_layers_with_keys():
    """While in the block, transformers sizes a causal mask from the first layer that holds
    keys: it counts a layer keeping a state and keys (Zamba2's hybrid ones) as recurrent,
    so with no plain attention layer it would size the mask from a layer of no slots."""
    from transformers import masking_utils

    find = masking_utils.find_first_full_attention_index

    def first_with_keys(cache) -> int:
        index = find(cache)
        layers = getattr(cache, "layers", [])
        if index < len(layers) and isinstance(layers[index], RecurrentLayer) and layers[index].max_cache_len == 0:
            holding = (i for i, layer in enumerate(layers) if isinstance(layer, RecurrentLayer) and layer.max_cache_len)
            return next(holding, index)
        return index

    masking_utils.find_first_full_attention_index = first_with_keys
    try:
        yield
    finally:
        masking_utils.find_first_full_attention_index = find


def _head_shapes_or_none_read(head_shapes):
    def shapes(config):
        if not hasattr(config, "num_attention_heads"):
            return 1, 1  # no layer of this model holds keys
        return head_shapes(config)

    return shapes


def _purely_recurrent(max_cache_len: int, **kwargs) -> RecurrentLayer:
    return RecurrentLayer(max_cache_len=0)


def attach_states(cached, state_shapes) -> list:
    """Allocates the states of ``cached.static_cache``'s recurrent layers (shapes and
    dtypes per layer: ``attention_probe.Probe.state_shapes``) and registers them as
    buffers of ``cached`` (a ``TorchExportableModuleWithStaticCache``), their KV caches
    of no slots dropped; the indices of those layers."""
    layers = []
    for i, (layer, shapes) in enumerate(zip(cached.static_cache.layers, state_shapes)):
        if not isinstance(layer, RecurrentLayer):
            continue
        if shapes is None:
            raise ExportError(f"layer {i} keeps a recurrent state, but one step of the model wrote none")
        made = {kind: [torch.zeros(shape, dtype=dtype) for shape, dtype in shapes[kind]] for kind in ("conv", "recurrent")}
        layer.attach(made["conv"], made["recurrent"])
        for kind, states in made.items():
            for index, state in enumerate(states):
                cached.register_buffer(f"{kind}_state_{i}_{index}", state, persistent=False)
        if layer.max_cache_len == 0:  # its position is the call's (start_call)
            for name in (f"key_cache_{i}", f"value_cache_{i}", f"cumulative_length_{i}"):
                del cached._buffers[name]
        layers.append(i)
    return layers


def start_call(cache, layers, start, scanned: bool = False):
    """Readies the recurrent ``layers`` of ``cache`` for a call whose first position is
    ``start`` (a 0-d tensor): their states zeroed when it is 0 (a new sequence; a later
    call continues from them), but for ``scanned`` ones (``SCANNED``) the convolution
    windows only, the scan starting from zeros itself; and the purely recurrent ones told
    the position as it is (a buffer each would be one more output of the same value,
    which torch.export's signature check refuses). Returns whether the call continues a
    sequence (``start > 0``)."""
    continues = start > 0
    for i in layers:
        layer = cache.layers[i]
        zeroed = layer.conv_states.values() if scanned else layer.states()
        for state in (state for state in zeroed if state is not None):
            state.copy_(torch.where(continues, state, torch.zeros((), dtype=state.dtype)))
        if layer.max_cache_len == 0:
            layer.cumulative_length = start
        else:
            layer.cumulative_length.copy_(start)
    return continues


def end_call(cache, layers) -> None:
    """Drops what ``start_call`` gave the layers: no traced value may outlive the call."""
    for i in layers:
        if cache.layers[i].max_cache_len == 0:
            cache.layers[i].cumulative_length = torch.tensor(0)
