"""The module ``etmlx.llm.causal_lm.export_methods`` traces: a Hugging Face causal LM over
transformers' static KV cache whose attention reads only the cache slots up to the last
position a call writes, in buckets. See ``etmlx.llm.causal_lm`` for why that is exact."""

import contextlib
import inspect
import sys

import torch
from transformers import AttentionInterface
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (AttentionMaskInterface, blockwise_overlay, causal_mask_function, or_masks,
                                        sdpa_mask)

from .attention_probe import attention_implementation, fit_to_attention, probe
from .cache_bindings import CacheBindings
from etmlx.errors import ExportError
from .quantized_cache import quantize_layers
from .recurrent_state import (
    NUMBERS_CALLS_FROM_ZERO, SCANNED, attach_states, cache_keyword, end_call, masks_sized_by_layers_with_keys,
    recurrent_static_layers, start_call,
)
from .sliding_cache import Rings
from .traced_call import TRACING

ATTENTION = "etmlx_windowed_sdpa"


class WindowedCausalLM(torch.nn.Module):
    """``forward(tokens [1, n], cache_position [n]) -> logits [1, vocab]`` (float32) of the
    last position: ExecuTorch's LLM-runner convention. The cache buffers are transformers' own
    (``TorchExportableModuleWithStaticCache``), so they carry the same names as in its
    export; ``kv_bits``: its full-attention layers' caches quantized to that many bits in
    groups of ``kv_group_size`` (``etmlx.llm.quantized_cache``); ``mrope``: positions in
    three dimensions, kept in ``next_position`` (``PositionedEmbeddedCausalLM``)."""

    def __init__(self, model, max_cache_len=None, window_step: int = 256, max_seq_len: int = 128,
                 kv_bits=None, kv_group_size: int = 64, mrope: bool = False):
        super().__init__()
        with recurrent_static_layers():
            self.cached = TorchExportableModuleWithStaticCache(model, max_cache_len=max_cache_len)
        fit_to_attention(self.cached, model)  # Falcon's one key/value head, DeepSeek-V3's narrower values
        # Convolution windows and linear-attention states (etmlx.llm.recurrent_state)
        self.recurrent = attach_states(self.cached, probe(model).state_shapes)
        self.cache_keyword = cache_keyword(model)
        self.numbers_calls_from_zero = model.config.get_text_config().model_type in NUMBERS_CALLS_FROM_ZERO
        self.scanned = model.config.get_text_config().model_type in SCANNED
        self.capacity = max(layer.max_cache_len for layer in self.cached.static_cache.layers) or \
            max_cache_len or model.generation_config.cache_config["max_cache_len"]  # a model with no attention
        self.window_step = window_step
        # Sliding-window layers over rings of W + max_seq_len slots (etmlx.llm.sliding_cache)
        self.rings = Rings(self.cached.static_cache, model.config.get_text_config(), self.capacity, max_seq_len)
        for i in self.rings.layers:
            layer = self.cached.static_cache.layers[i]
            self.cached.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.cached.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
            self.cached.register_buffer(f"cumulative_length_{i}", layer.cumulative_length, persistent=False)
        if self.rings:  # where the last call ended
            self.register_buffer("ring_end", torch.zeros((), dtype=torch.long), persistent=False)
        # Multimodal RoPE (Qwen2.5-VL): entry s is the RoPE position the row written to
        # cache slot s starts from (``_mrope_positions``); images make it run apart from s
        self.mrope = mrope
        if mrope:
            if not any(hasattr(module, "mrope_section") for module in model.modules()):
                raise ExportError(f"{type(model).__name__} numbers its positions in one dimension, not three")
            self.register_buffer("next_position", torch.zeros(self.capacity + 1, dtype=torch.long), persistent=False)
        self.quantized = quantize_layers(self.cached, self.cached.static_cache, kv_bits, kv_group_size,
                                         skip=self.rings.layers + self.recurrent)
        for name in [name for name, buffer in self.cached._buffers.items() if buffer is not None and not buffer.numel()]:
            del self.cached._buffers[name]  # an empty cache (Nemotron-H's MLP layers): no input of the program
        self.bindings = CacheBindings(self.cached, self.cached.static_cache.layers)

    def window(self, last_position):
        """The cache slots attention reads when ``last_position`` is the last written: the
        capacity less whole steps past that position (capacity, capacity - step, ...), a
        size read from the call's positions on the host, so each bucket compiles once."""
        return self.capacity - (self.capacity - 1 - last_position) // self.window_step * self.window_step

    def forward(self, tokens, cache_position):
        return self.call({"input_ids": tokens}, tokens.shape[1], cache_position)

    def call(self, model_inputs: dict, length, cache_position, blocks=None, placement=None):
        """The model on ``model_inputs`` (its ids, or its embeddings) of ``length`` positions;
        ``blocks``: each position's image block, whose tokens attend to each other both ways
        (-1: a token; ``MarkedEmbeddedCausalLM``); ``placement``: each row's RoPE offsets
        and advance, for a model of multimodal RoPE (``PositionedEmbeddedCausalLM``;
        None: tokens, one position each)."""
        held = self.bindings.bind()  # the layers' tensors: the buffers being traced
        try:
            return self._call(model_inputs, length, cache_position, blocks, placement)
        finally:
            self.bindings.unbind(held)

    def _call(self, model_inputs: dict, length, cache_position, blocks, placement):
        # Bound-checked by the runtimes: every position written must lie in the cache, and
        # then inside the window (% keeps the window's size in range for the first check
        # to name a position that is not; twice, as ExecuTorch's C++ scalar mod keeps the
        # sign of a negative position where Python's does not).
        inside = torch.index_select(torch.arange(self.capacity), 0, cache_position)
        window = self.window((cache_position[-1].item() % self.capacity + self.capacity) % self.capacity)
        written = torch.index_select(torch.arange(self.capacity)[:window], 0, inside)
        start = written[:1].reshape(())
        for i, layer in enumerate(self.cached.static_cache.layers):
            if i not in self.recurrent:
                layer.cumulative_length.copy_(start)
        parameters = inspect.signature(self.cached.model.forward).parameters
        last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters and self.last_only else {}
        # the call's positions, to a model that would number every call's tokens from 0
        positions = {"position_ids": written[None]} if self.numbers_calls_from_zero else {}
        if self.mrope:
            positions = {"position_ids": self._mrope_positions(written, placement)}
        try:
            continues = start_call(self.cached.static_cache, self.recurrent, start, self.scanned)
            if self.rings:
                self.rings.call(self.cached.static_cache, start, length, self.ring_end, blocks)
            TRACING.window, TRACING.rings, TRACING.quantized = window, self.rings, self.quantized
            TRACING.continues = continues if self.scanned else None
            if blocks is not None:  # by cache position, as transformers' block mask reads them
                TRACING.blocks = torch.full((1, self.capacity), -1, dtype=blocks.dtype).index_put(
                    (torch.zeros_like(inside), inside), blocks)
            with masks_sized_by_layers_with_keys():
                outputs = self.cached.model(
                    **model_inputs, attention_mask=None, **{self.cache_keyword: self.cached.static_cache},
                    use_cache=True, **positions, **last_only,
                )
        finally:  # no traced value may outlive the call: torch.export would make it an output
            TRACING.clear()
            self.rings.forget(self.cached.static_cache)
            end_call(self.cached.static_cache, self.recurrent)
        # float32 whatever the model's dtype: numpy callers (etmlx's Session) would get
        # bfloat16 logits as their 16-bit patterns, and the LLM runners sample float32
        return (outputs.logits[:, -1, :] if self.last_only else outputs.logits).float()

    def _mrope_positions(self, written, placement):
        """``position_ids [3, 1, n]`` (time, height, width) of a call writing the cache
        slots ``written``: a row starts where the rows before it ended (``next_position``
        at the first slot, then the positions each advances), plus its own offsets; each
        slot's end is kept, so a call at any earlier slot (a rewind) starts right too.
        ``placement [n, 4]``: offsets and advance; None, tokens (no offset, one each)."""
        if placement is None:
            offsets, advance = torch.zeros_like(written)[None].expand(3, -1), torch.ones_like(written)
        else:
            offsets, advance = placement[:, :3].T, placement[:, 3]
        ends = torch.index_select(self.next_position, 0, written[:1]) + torch.cumsum(advance, 0)
        self.next_position.index_copy_(0, written + 1, ends)
        return ((ends - advance)[None] + offsets)[:, None, :]

    last_only = True


class VerifyingCausalLM(WindowedCausalLM):
    """``verify(tokens [1, n], cache_position [n]) -> logits [1, n, vocab]``: the same call
    as ``forward``, returning every position's logits, which a speculative decoder's
    target needs to check n - 1 drafted tokens in one call (``etmlx.llm.speculative``).
    Its buffers carry ``WindowedCausalLM``'s names, so both methods share one cache;
    ``forward`` keeps computing the last position's logits only."""

    last_only = False


class EmbeddedCausalLM(WindowedCausalLM):
    """``text_decoder(embeddings [1, n, hidden], cache_position [n]) -> logits [1, vocab]``:
    ``forward`` on input embeddings instead of ids, ExecuTorch's multimodal convention for
    a prompt whose image placeholders hold image features (``etmlx.multimodal``). Its
    buffers carry ``WindowedCausalLM``'s names: one cache for both methods."""

    def forward(self, embeddings, cache_position):
        return self.call({"inputs_embeds": embeddings}, embeddings.shape[1], cache_position)


class MarkedEmbeddedCausalLM(WindowedCausalLM):
    """``text_decoder(marked [1, n, hidden + 1], cache_position) -> logits [1, vocab]``:
    ``EmbeddedCausalLM`` for a model whose image tokens attend to every token of their
    image, later ones too (Gemma 3; transformers' block mask). The last channel marks an
    image's rows (1; the image methods write it, 0 for a token's embedding), so the call
    knows its image tokens though it takes no third input: ExecuTorch's MultimodalRunner
    passes two. Consecutive marked rows are one image, so an image must come whole in one
    call (the runner prefills an image in one; ``Session`` never splits one)."""

    def forward(self, marked, cache_position):
        embeddings, image = marked[..., :-1], marked[0, :, -1] > 0.5
        # an image's rows share the count of token rows up to them, and the next image's differs
        blocks = torch.where(image, torch.cumsum((~image).long(), 0), -1)
        return self.call({"inputs_embeds": embeddings}, marked.shape[1], cache_position, blocks)


class PositionedEmbeddedCausalLM(WindowedCausalLM):
    """``text_decoder(placed [1, n, hidden * (1 + k) + 4], cache_position) -> logits [1, vocab]``:
    ``EmbeddedCausalLM`` for a model of multimodal RoPE (Qwen2.5-VL), whose image rows
    take positions in time, height and width. The last four channels place each row (the
    image methods write them; ``etmlx.multimodal.grid_encoder``): its offsets from where
    it starts, and the positions it advances (a token's embedding: 0, 0, 0, 1), so the call
    positions its rows though it takes no third input: ExecuTorch's MultimodalRunner
    passes two. Between the embedding and the placement, k more vectors of ``hidden``
    (Qwen3-VL's deepstack: k = 0 for others), each added to the row's hidden state after
    one of the first k layers (a token's: zeros, which leave it as it is)."""

    def forward(self, placed, cache_position):
        rows, placement = placed[..., :-4], placed[0, :, -4:].long()
        embeddings, *stacked = rows.split(self.cached.model.get_input_embeddings().embedding_dim, -1)
        inputs = {"inputs_embeds": embeddings}
        if stacked:  # (transformers adds them at a mask's image rows, which a trace cannot select)
            inputs.update(deepstack_visual_embeds=stacked, visual_pos_masks=None)
        with _stacked_into_every_row(self.cached.model.model, bool(stacked)):
            return self.call(inputs, placed.shape[1], cache_position, placement=placement)


class SampledCausalLM(WindowedCausalLM):
    """``sample(tokens, cache_position, temperature, top_k, top_p, min_p, uniform) -> the
    next token id [1]``: ``WindowedCausalLM``'s logits sampled inside the graph, by the host
    sampler's rules (``etmlx.llm.generation.Sampler``: temperature, then top-k, top-p, min-p;
    ``top_k`` 0 is off) and inverse-CDF draw of ``uniform``, a number in [0, 1) the host
    draws from its seeded generator: device and host sampling follow one random stream.
    Its buffers carry ``WindowedCausalLM``'s names, so both methods share one cache."""

    def forward(self, tokens, cache_position, temperature, top_k, top_p, min_p, uniform):
        scaled = super().forward(tokens, cache_position)[0] / temperature
        vocab = scaled.shape[-1]
        order = torch.sort(-scaled, stable=True).indices  # likeliest first, ties by lower id
        ranked = scaled[order]
        keep = torch.arange(vocab) < torch.where(top_k > 0, top_k, vocab)
        probabilities = torch.softmax(torch.where(keep, ranked, -torch.inf), -1)
        keep = keep & (torch.cumsum(probabilities, -1) - probabilities < top_p)  # the mass before each token
        keep = keep & (probabilities >= min_p * probabilities[0])
        cumulative = torch.cumsum(torch.softmax(torch.where(keep, ranked, -torch.inf), -1), -1)
        chosen = torch.clamp((cumulative <= uniform * cumulative[-1]).sum(), max=vocab - 1)
        return torch.index_select(order, 0, chosen.reshape(1))


@contextlib.contextmanager
def _stacked_into_every_row(text_model, stacked: bool):
    """Qwen3-VL's text model adding each deepstack vector to its row, every row (a
    token's vectors are zeros: ``PositionedEmbeddedCausalLM``), where transformers adds
    them to the rows a boolean mask selects, a shape only the data decides."""
    if not stacked:
        yield
        return
    text_model._deepstack_process = lambda hidden, mask, vectors: hidden + vectors.to(hidden.dtype)
    try:
        yield
    finally:
        del text_model._deepstack_process


def windowed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention over the first ``TRACING.window`` slots of the cache."""
    etmlx_window = TRACING.window
    if etmlx_window is None:  # registered only while etmlx.llm.causal_lm traces a WindowedCausalLM
        raise ExportError("etmlx's windowed attention runs only inside etmlx.llm.causal_lm.export_methods")
    if attention_mask is None:
        raise ExportError("windowed attention needs the causal mask over the cache, and the model passed none")
    rings, layer = TRACING.rings, getattr(module, "layer_idx", None)
    if layer in TRACING.quantized:
        return _quantized(module, query, TRACING.quantized[layer], attention_mask, etmlx_window, **kwargs)
    if key.dtype == torch.int32:
        raise ExportError(f"{type(module).__name__} names no layer_idx, so etmlx cannot tell which quantized cache "
                          "its attention reads; export it without kv_bits")
    if layer in rings.layers:  # keys and values: the ring, then the call's own
        mask = rings.current.mask  # a copy of it marks the graph as windowed (attends_through_window)
        attention_mask = torch.ops.aten.slice_copy.Tensor(mask, -1, 0, mask.shape[-1])
    else:
        # slice_copy, not a view: a view's contiguity would make torch.export specialize on L.
        key, value = (torch.ops.aten.slice_copy.Tensor(t, 2, 0, etmlx_window) for t in (key, value))
        attention_mask = torch.ops.aten.slice_copy.Tensor(attention_mask, -1, 0, etmlx_window)
    if kwargs.get("softcap") is not None:
        return _softcapped(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _quantized(module, query, layer, attention_mask, window, dropout=0.0, scaling=None, **kwargs):
    """Attention over a quantized cache (``QuantizedLayer.attention``); a variant it does
    not compute is refused by name."""
    other = sorted(name for name in ("softcap", "s_aux") if kwargs.get(name) is not None)
    if other or dropout:
        raise ExportError(f"{type(module).__name__}'s attention takes {', '.join(other) or 'dropout'}, which etmlx's "
                          "quantized cache does not compute; export it without kv_bits")
    mask = torch.ops.aten.slice_copy.Tensor(attention_mask, -1, 0, window)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return layer.attention(query, mask, window, scaling), None


def _softcapped(module, query, key, value, attention_mask, **kwargs):
    """Attention with a logit softcap (Gemma 2), which transformers' SDPA refuses: the
    model family's own eager attention over the window (scores, tanh cap, mask, softmax,
    each an op MLX computes), its boolean mask made additive as that function takes it."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ExportError(f"{type(module).__name__} caps its attention logits (softcap), which SDPA cannot, and its "
                          "module has no eager_attention_forward to compute them with")
    if attention_mask.dtype == torch.bool:
        attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    return eager(module, query, key, value, attention_mask, **kwargs)


def _sdpa_mask_over_the_cache(*args, mask_function=causal_mask_function, **kwargs):
    """transformers' SDPA mask, always made: run eagerly (the quantized cache's reference),
    it would skip a mask it deems plainly causal, but the window holds slots past the
    last position; traced, it never skips. A call of image blocks (``TRACING.blocks``)
    also lets each image's tokens see their whole image, as transformers' block mask does."""
    if TRACING.blocks is not None:
        mask_function = or_masks(mask_function, blockwise_overlay(TRACING.blocks))
    return sdpa_mask(*args, mask_function=mask_function, **{**kwargs, "allow_is_causal_skip": False})


@contextlib.contextmanager
def windowed_attention(model):
    """Routes ``model``'s attention (and the mask it builds) through ``windowed_sdpa``
    while tracing; the model's own attention setting is restored after."""
    AttentionInterface.register(ATTENTION, windowed_sdpa)
    AttentionMaskInterface.register(ATTENTION, _sdpa_mask_over_the_cache)
    with attention_implementation(model, ATTENTION):
        yield


class Prefixed(torch.nn.Module):
    """``module``'s calls, its buffers named ``prefix.`` and their own names: another
    model's caches in the same file (``etmlx.llm.draft``) keep names of their own."""

    def __init__(self, prefix: str, module):
        super().__init__()
        self.prefix = prefix
        self.add_module(prefix, module)

    def forward(self, *arguments):
        return getattr(self, self.prefix)(*arguments)


def attends_through_window(program) -> bool:
    """Whether an exported ``WindowedCausalLM`` sliced its cache: a model that computes
    attention without transformers' AttentionInterface never calls ``windowed_sdpa``."""
    return any(node.target is torch.ops.aten.slice_copy.Tensor for node in program.graph.nodes)
