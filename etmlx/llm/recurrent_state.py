"""Layers that keep a recurrent state instead of keys and values -- LFM2's short
convolutions, the gated delta nets of Qwen3.5 and Qwen3-Next -- exported with that state
as buffers of the MLX delegate, beside the KV caches.

transformers' static cache makes such a layer a ``LinearAttentionLayer`` that allocates
its states on first use and branches on Python flags (first call or not, one token or
many): nothing torch.export can keep. Here each is a ``RecurrentLayer`` whose states are
allocated up front (their shapes from one step on fake tensors, ``attention_probe``) and
always "have a previous state": every call concatenates the stored convolution window
before its own tokens and starts the recurrence from the stored state, so one graph
serves prefill, a later chunk of a long prompt, and decode. A call at position 0 starts a
new sequence: the states are zeroed first (in the graph), as transformers starts one.

The gated delta rule's own recurrence (``torch_chunk_gated_delta_rule`` in the modeling
module, a loop over chunks that torch.export cannot keep for a length it does not know)
is replaced while tracing by ``etmlx::gated_delta``, which lowering turns into
``mx.fast.gated_delta_update``. Its state is kept in MLX's layout (B, Hv, Dv, Dk).
"""

import contextlib
import sys

import torch
from transformers import cache_utils

from etmlx.errors import ExportError
from etmlx.lowering import custom_ops  # noqa: F401  (registers torch.ops.etmlx.gated_delta)

# The text model types whose recurrent layers etmlx exports, and what those layers compute.
FAMILIES = {
    "lfm2": "short convolutions",
    "lfm2_moe": "short convolutions",
    "qwen3_5_text": "gated delta nets",
    "qwen3_5_moe_text": "gated delta nets",
    "qwen3_next": "gated delta nets",
}
# transformers' static-cache layer types that keep a recurrent state.
RECURRENT_TYPES = ("conv", "linear_attention")


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
    they would have ``LinearAttentionLayer``s."""
    mapping = cache_utils.STATIC_LAYER_TYPE_MAPPING
    before = {kind: mapping[kind] for kind in RECURRENT_TYPES}
    for kind in RECURRENT_TYPES:
        mapping[kind] = _purely_recurrent
    try:
        yield
    finally:
        mapping.update(before)


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
        if layer.max_cache_len == 0:  # its position is the call's (start_sequence)
            for name in (f"key_cache_{i}", f"value_cache_{i}", f"cumulative_length_{i}"):
                del cached._buffers[name]
        layers.append(i)
    return layers


def start_call(cache, layers, start) -> None:
    """Readies the recurrent ``layers`` of ``cache`` for a call whose first position is
    ``start`` (a 0-d tensor): their states zeroed when it is 0 (a new sequence; a later
    call continues from them), and the purely recurrent ones told the position as it is
    (a buffer each would be one more output of the same value, which torch.export's
    signature check refuses)."""
    continues = start > 0
    for i in layers:
        layer = cache.layers[i]
        for state in layer.states():
            state.copy_(torch.where(continues, state, torch.zeros((), dtype=state.dtype)))
        if layer.max_cache_len == 0:
            layer.cumulative_length = start
        else:
            layer.cumulative_length.copy_(start)


def end_call(cache, layers) -> None:
    """Drops what ``start_call`` gave the layers: no traced value may outlive the call."""
    for i in layers:
        if cache.layers[i].max_cache_len == 0:
            cache.layers[i].cumulative_length = torch.tensor(0)


def gated_delta_rule(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """transformers' ``torch_chunk_gated_delta_rule`` (and its one-token twin) as one
    ``etmlx::gated_delta`` call: the same normalizations in float32, the decay made
    linear, the state in MLX's layout (B, Hv, Dv, Dk)."""
    dtype = query.dtype
    query, key, value, g, beta = (x.float() for x in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query / query.shape[-1] ** 0.5
    if initial_state is None:
        batch, _, heads, value_size = value.shape
        initial_state = value.new_zeros(batch, heads, value_size, key.shape[-1])
    output, state = torch.ops.etmlx.gated_delta(query, key, value, g.exp(), beta, initial_state.float())
    return output.to(dtype), state if output_final_state else None


def _l2norm(x, eps: float = 1e-6):
    """transformers' (and FLA's) l2norm of the gated delta rule."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


# The modeling modules' recurrence functions ``recurrent_kernels`` replaces.
_REPLACED = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


@contextlib.contextmanager
def recurrent_kernels(model):
    """While in the block, ``model``'s gated delta nets compute their recurrence with
    ``gated_delta_rule``. No-op for a model without them."""
    module = sys.modules[type(model).__module__]
    replaced = {name: getattr(module, name) for name in _REPLACED if hasattr(module, name)}
    for name in replaced:
        setattr(module, name, gated_delta_rule)
    try:
        yield
    finally:
        for name, function in replaced.items():
            setattr(module, name, function)
