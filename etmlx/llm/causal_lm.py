"""Hugging Face causal LMs exported for generation in ExecuTorch's LLM-runner convention,
with attention over the filled part of the KV cache only.

One method, ``forward(tokens [1, n], cache_position [n]) -> logits [1, vocab]`` (the last
position's), serves prefill (n up to ``max_seq_len``, longer prompts in chunks) and decode
(n = 1), over a static cache of ``max_context_len`` slots inside the MLX delegate; the
constant methods ExecuTorch's ``TextLLMRunner`` reads (``get_max_seq_len``, ...) are
written beside it, so the runner drives the file unchanged.

transformers' ``TorchExportableModuleForDecoderOnlyLM`` attends over the whole static
cache at every step (its mask hides the empty slots), so a decode step at position 10
costs what one at position 4000 does. Here keys, values and the mask are sliced to the
first W slots before attention, W read from the call's last cache position on the host
(ExecuTorch's scalar ops, before the delegate runs) and rounded up to a bucket of
``window_step`` slots counted down from the capacity, so the runtimes compile one graph per
bucket. That gives the logits of the whole-cache form because the causal mask hides every
slot after the last position written, so nothing past it is read either way. The graph
checks every position against W (an index both runtimes bound-check), so a position past
the cache raises ``IndexRangeError`` instead of returning other numbers.
"""

import contextlib
import logging
import re

from etmlx.errors import ExportError, first_line
from etmlx.pipeline import fewer_collections

log = logging.getLogger("etmlx")

WINDOW_STEP = 256
# The constant methods ExecuTorch's LLM runner reads (extension/llm/runner/constants.h).
RUNNER_METHODS = ("get_max_seq_len", "get_max_context_len", "get_vocab_size", "get_bos_id", "get_eos_ids",
                  "use_kv_cache", "enable_dynamic_shape")
# etmlx's own constant method, beside them: true when layers keep a recurrent state
# (etmlx.llm.recurrent_state), which cannot go back to an earlier position.
RECURRENT_STATE_METHOD = "use_recurrent_state"


def export_methods(model, max_seq_len: int = 128, max_context_len=None, window_step: int = WINDOW_STEP,
                   sample_on_device: bool = False, kv_bits=None, kv_group_size: int = 64, verify: bool = False,
                   embeddings=False, stacked_features: int = 0, buffer_prefix=None) -> dict:
    """``{"forward": ExportedProgram, "get_max_seq_len": ..., ...}`` of a Hugging Face
    causal LM (for ``etmlx.export_methods``): ``forward`` takes 1 to ``max_seq_len`` tokens
    per call; the cache holds ``max_context_len`` tokens (default: the model's
    ``generation_config``); the other entries are the runner's constant methods.
    ``sample_on_device`` adds ``sample`` (``windowed_cache.SampledCausalLM``): the same
    call, returning the next token id drawn inside the MLX delegate, over the same cache.
    ``kv_bits`` (4 or 8): the full-attention layers' caches quantized, in groups of
    ``kv_group_size`` values of a head (``etmlx.llm.quantized_cache``). ``verify`` adds
    ``verify`` (``windowed_cache.VerifyingCausalLM``): the same call returning every
    position's logits, for a speculative decoder's target (``etmlx.llm.speculative``).
    ``embeddings`` adds ``text_decoder`` (``windowed_cache.EmbeddedCausalLM``): the call on
    input embeddings, over the same cache (``etmlx.multimodal``); ``embeddings="marked"``,
    on embeddings whose last channel marks image rows, whose tokens see their whole image
    (``windowed_cache.MarkedEmbeddedCausalLM``: Gemma 3); ``embeddings="positioned"``, on
    embeddings whose last four channels place each row in multimodal RoPE
    (``windowed_cache.PositionedEmbeddedCausalLM``: Qwen2.5-VL), ``stacked_features``
    more vectors of the hidden size before them (Qwen3-VL's deepstack). ``buffer_prefix``: the
    caches' names start with it (``draft.cached.key_cache_0``), so that another model's
    methods in the same file keep caches of their own (``etmlx.llm.draft``)."""
    from etmlx.lowering.repeated_layers import LayersTraced

    from .attention_probe import probe
    from .windowed_cache import attends_through_window, windowed_attention

    refuse_recurrent_layers(model.config)
    if not isinstance(window_step, int) or window_step < 1:
        raise ExportError(f"window_step={window_step!r}: expected a number of cache slots, 1 or more")

    def wrappers(of) -> tuple:
        return _wrappers(of, max_context_len, window_step, max_seq_len, sample_on_device, verify, embeddings,
                         stacked_features, buffer_prefix, kv_bits=kv_bits, kv_group_size=kv_group_size)

    traced, module = wrappers(model)
    capacity = module.capacity
    attention = any(shape is not None for shape in probe(model).layer_shapes)
    if probe(model).through_interface or not attention:  # (Mamba2 has no attention to route)
        programs = _traced_methods(model, traced, windowed_attention, wrappers if buffer_prefix is None else None)
        forward = programs["forward"].program if isinstance(programs["forward"], LayersTraced) else programs["forward"]
        if attention and not attends_through_window(forward):  # took the interface, not the window
            raise ExportError(f"{type(model).__name__}'s attention did not read its cache through etmlx's window")
    else:
        if kv_bits is not None:
            raise ExportError(f"{type(model).__name__} does not call attention through transformers' "
                              "AttentionInterface, so etmlx cannot attend over a quantized cache; export it without kv_bits")
        log.warning("%s does not call attention through transformers' AttentionInterface: each step attends over "
                    "the whole cache of %d slots (exact, but decode does not speed up at short contexts)",
                    type(model).__name__, capacity)
        programs = _trace(model, traced, contextlib.nullcontext())  # its own attention and mask
    recurrent = {RECURRENT_STATE_METHOD: True} if module.recurrent else {}
    return {**programs, **runner_metadata(model, max_seq_len, capacity), **recurrent}


def _wrappers(model, max_context_len, window_step, max_seq_len, sample_on_device, verify, embeddings,
              stacked_features, buffer_prefix, **cache) -> tuple:
    """``{method: (wrapper, example inputs, dynamic shapes)}`` of ``export_methods``'s
    arguments, each wrapper over ``model``'s layers as it holds them now, and ``forward``'s
    ``WindowedCausalLM``."""
    import torch
    from torch.export import Dim

    from .windowed_cache import (EmbeddedCausalLM, MarkedEmbeddedCausalLM, PositionedEmbeddedCausalLM, Prefixed,
                                 SampledCausalLM, VerifyingCausalLM, WindowedCausalLM)

    # text_decoder's class, and the channels its rows carry past the embedding
    decoders = {True: (EmbeddedCausalLM, 0), "marked": (MarkedEmbeddedCausalLM, 1),
                "positioned": (PositionedEmbeddedCausalLM, 4)}
    # every method over the cache numbers positions alike: in three dimensions for rows that carry theirs
    cache["mrope"] = embeddings == "positioned"
    module = WindowedCausalLM(model, max_context_len, window_step, max_seq_len, **cache)
    capacity = module.capacity
    if not isinstance(max_seq_len, int) or not 1 <= max_seq_len <= capacity:
        raise ExportError(f"max_seq_len={max_seq_len!r}: expected 1 to the cache's {capacity} tokens")
    length = min(2, max_seq_len)
    inputs = (torch.zeros(1, length, dtype=torch.long), torch.arange(length))
    # DYNAMIC, not a named Dim: torch cannot prove some guards true for every length (a
    # GQA repeat over a ring and the call's keys: min(16*L, 32*L) == 16*L, L = ring + n)
    # and a named Dim refuses them; _trace checks the guards at every length itself.
    seq = Dim.DYNAMIC(min=1, max=max_seq_len) if max_seq_len > 1 else None
    traced = {"forward": (module, inputs, ({1: seq}, {0: seq}))}
    if sample_on_device:
        settings = (torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.5]))
        traced["sample"] = (SampledCausalLM(model, max_context_len, window_step, max_seq_len, **cache), inputs + settings,
                            ({1: seq}, {0: seq}) + (None,) * len(settings))
    if verify:
        traced["verify"] = (VerifyingCausalLM(model, max_context_len, window_step, max_seq_len, **cache), inputs,
                            ({1: seq}, {0: seq}))
    if embeddings:
        decoder_class, channels = decoders[embeddings]
        hidden = model.get_input_embeddings().embedding_dim * (1 + stacked_features) + channels
        embedded = (torch.zeros(1, length, hidden, dtype=model.get_input_embeddings().weight.dtype), inputs[1])
        decoder = decoder_class(model, max_context_len, window_step, max_seq_len, **cache)
        traced["text_decoder"] = (decoder, embedded, ({1: seq}, {0: seq}))
    if buffer_prefix is not None:
        traced = {name: (Prefixed(buffer_prefix, wrapper), arguments, (shapes,))  # its forward(*arguments)
                  for name, (wrapper, arguments, shapes) in traced.items()}
    return traced, module


def _traced_methods(model, traced: dict, attention, wrappers) -> dict:
    """``_trace`` of ``traced`` under ``attention(model)``; where the model's layers repeat
    (``repeated_layers``), a ``LayersTraced`` per method instead, whose program is of the
    wrappers ``wrappers(short)`` makes over a model of its first layers (``first_layers``)."""
    from etmlx.lowering.repeated_layers import LayersTraced

    from .first_layers import first_layers
    from .repeated_layers import TRACED, repeats, whole_model

    if wrappers is None or not repeats(model):
        return _trace(model, traced, attention(model))
    short = first_layers(model, TRACED)
    programs = _trace(short, wrappers(short)[0], attention(short))
    total = model.config.get_text_config().num_hidden_layers

    def full(name):
        return _trace(model, {name: traced[name]}, attention(model))[name]

    return {name: LayersTraced(program, TRACED, total, whole_model(traced[name][0], model), lambda name=name: full(name))
            for name, program in programs.items()}


@fewer_collections()
def _trace(model, traced: dict, attention) -> dict:
    """``{name: ExportedProgram}`` of each ``(wrapper, inputs, dynamic shapes)`` in
    ``traced``, under ``attention`` (a context that routes the model's attention)."""
    import torch

    from .recurrent_kernels import recurrent_kernels
    from .experts import batched_experts

    programs = {}
    with attention, batched_experts(model), recurrent_kernels(model), torch.no_grad():
        for name, (wrapper, arguments, shapes) in traced.items():
            try:  # non-strict: the model's Python runs on fake tensors (dynamo's strict trace took 2-3x as long)
                program = torch.export.export(wrapper, arguments, dynamic_shapes=shapes, strict=False)
            except ExportError:
                raise
            except Exception as error:
                raise ExportError(f"{type(model).__name__} does not export as a causal LM over transformers' static "
                                  f"cache: {_trace_failure(error)}") from error
            broken = _broken_guard(program, wrapper, arguments, shapes)
            if broken:
                raise ExportError(f"{type(model).__name__} does not export as a causal LM over transformers' static "
                                  f"cache: its trace holds only under the guard {broken}")
            programs[name] = program
    return programs


def _broken_guard(program, wrapper, arguments, shapes):
    """The first guard of ``program`` (a condition on its inputs' sizes that torch.export
    could not prove, kept beside the program) that some allowed call length breaks, with
    that length; None when every length from 1 to the dynamic dims' maximum keeps them
    all. Each is evaluated on meta tensors of each length."""
    import inspect

    import torch

    if len(shapes) == 1 and len(arguments) > 1:  # forward(*arguments) (``Prefixed``): one spec per argument inside
        shapes = shapes[0]
    dynamic = [(index, dim, hint) for index, spec in enumerate(shapes) if spec for dim, hint in spec.items()]
    if not dynamic or not program._guards_code:
        return None
    for length in range(1, max(hint.max for _, _, hint in dynamic) + 1):
        sizes = [list(argument.shape) for argument in arguments]
        for index, dim, _ in dynamic:
            sizes[index][dim] = length
        meta = [torch.empty(size, dtype=argument.dtype, device="meta") for size, argument in zip(sizes, arguments)]
        named = dict(inspect.signature(wrapper.forward).bind(*meta).arguments)
        for guard in program._guards_code:
            if not eval(guard, {"L": named, "torch": torch}):  # torch's own generated code, over sizes
                return f"{guard}, which a call of {length} tokens breaks"
    return None


def refuse_recurrent_layers(config) -> None:
    """One ExportError naming the family when transformers' static cache for ``config``
    has layers that keep a recurrent state instead of keys and values, of a kind etmlx
    does not export (``etmlx.llm.recurrent_state`` names the families it does). Read from the config alone, before any weight is loaded."""
    from transformers import StaticCache
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    from .recurrent_state import FAMILIES as recurrent_families, exported_family

    if exported_family(config):
        return
    text = config.get_text_config()
    try:
        layers = StaticCache(config=text, max_cache_len=1).layers
    except (AttributeError, TypeError, ValueError):
        return  # a config transformers' own cache cannot read: tracing names what it lacks
    recurrent = [index for index, layer in enumerate(layers) if isinstance(layer, LinearAttentionCacheLayerMixin)]
    if not recurrent:
        return
    layer_types = getattr(text, "layer_types", None) or []
    kinds = sorted({layer_types[i] if i < len(layer_types) else type(layers[i]).__name__ for i in recurrent})
    raise ExportError(
        f"{config.model_type}: {len(recurrent)} of its {len(layers)} layers keep a recurrent state "
        f"({', '.join(kinds)}) of a kind etmlx does not export yet; export-llm takes causal LMs of attention "
        "layers (full or sliding-window), and the hybrids of short convolutions, gated delta nets, Mamba2 or "
        "Mamba selective state spaces "
        f"({', '.join(sorted({name.removesuffix('_text') for name in recurrent_families}))})")


def with_static_cache(model, max_context_len: int):
    """``model`` in eval mode, set to generate over a static cache of ``max_context_len``
    tokens (what ``export_methods`` traces)."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        **{k: v for k, v in model.generation_config.to_dict().items() if k in ("bos_token_id", "eos_token_id", "pad_token_id")},
        use_cache=True, cache_implementation="static", max_length=max_context_len,
        cache_config={"batch_size": 1, "max_cache_len": max_context_len},
    )
    return model.eval()


def _trace_failure(error) -> str:
    """The reason in torch.export's pages of text: the exception the traced code raised
    (or a fake-tensor call got), where torch names it, else its type and first line."""
    text = str(error).strip()
    raised = re.search(r"(?:raised exception|got) (\w+)\((['\"])(.*?)\2\)", text)
    if raised:
        return f"{raised.group(1)}: {raised.group(3)}"
    return f"{type(error).__name__}: {first_line(error)}"


def runner_metadata(model, max_seq_len: int, capacity: int) -> dict:
    """The constant methods ExecuTorch's LLM runner reads (its ``constants.h``)."""
    config = model.config
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = config.eos_token_id if eos is None else eos
    metadata = {
        "get_max_seq_len": max_seq_len,
        "get_max_context_len": capacity,
        "get_vocab_size": config.get_text_config().vocab_size,
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
    }
    if getattr(config, "bos_token_id", None) is not None:
        metadata["get_bos_id"] = int(config.bos_token_id)
    if eos is not None:
        metadata["get_eos_ids"] = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return metadata


def metadata(program, prefix: str = "") -> dict:
    """A loaded program's runner metadata: ``{"get_max_seq_len": 128, ..., "get_eos_ids":
    [2]}`` (each a value, ``get_eos_ids`` a list), read from the methods named ``prefix``
    and each name (a draft's in its target's file: ``draft_get_max_seq_len``)."""
    values = {}
    for name in (*RUNNER_METHODS, RECURRENT_STATE_METHOD):
        if prefix + name in program.method_names:
            result = list(program.run_method(prefix + name, []))
            values[name] = result if name == "get_eos_ids" else result[0]
    return values
