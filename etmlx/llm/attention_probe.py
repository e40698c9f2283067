"""One eager step of a causal LM that tells how its attention meets transformers' static
cache: each layer's key and value shapes, and whether it calls attention through
transformers' ``AttentionInterface``.

``TorchExportableModuleWithStaticCache`` allocates every layer's keys and values from the
config's head count and head size, one shape for both. Some families' attention writes
other shapes: Falcon's multi-query attention one key/value head where its config counts
one per query head, DeepSeek-V3's latent attention values narrower than its keys; the
cache's ``index_copy_`` then fails while tracing. And a family whose attention bypasses
the interface (GPT-J, Falcon) would be handed the window's mask by etmlx's windowed
attention without ever slicing its keys to the window: wrong numbers. The step runs over a
lazily allocated cache, with the attention interface set to a recorder whose output is
zeros: only what the cache was given and whether the recorder ran are read. The same step
gives the shapes of the recurrent states a hybrid model's other layers keep
(``etmlx.llm.recurrent_state``).
"""

import contextlib
import dataclasses
import weakref

import torch
from transformers import AttentionInterface, StaticCache
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from etmlx.errors import ExportError, first_line

from .experts import batched_experts
from .recurrent_kernels import recurrent_kernels
from .recurrent_state import cache_keyword

_PROBE = "etmlx_probe"
_PROBED = weakref.WeakKeyDictionary()  # model -> its Probe (shapes and routing do not change)


@dataclasses.dataclass(frozen=True)
class Probe:
    layer_shapes: tuple  # per cache layer: (heads, key size, value size), or None where it holds no keys
    through_interface: bool
    # per cache layer: {"conv": [(shape, dtype), ...], "recurrent": [...]} of the recurrent
    # states it wrote (etmlx.llm.recurrent_state), or None for a layer of keys and values
    state_shapes: tuple = ()


def probe(model) -> Probe:
    """What one eager token of ``model`` writes into a static cache, and how it attends."""
    if model not in _PROBED:
        _PROBED[model] = _step(model)
    return _PROBED[model]


def _step(model) -> Probe:
    calls = []

    def recorded(module, query, key, value, attention_mask, **kwargs):
        calls.append(module)
        batch, heads, length = query.shape[:3]
        return query.new_zeros(batch, length, heads, value.shape[-1]), None

    AttentionInterface.register(_PROBE, recorded)
    AttentionMaskInterface.register(_PROBE, sdpa_mask)
    try:
        cache = _run_fake(model)
    except Exception:  # a step fake tensors cannot take (a value read on the host): run it on the weights
        cache = None
    if cache is None:
        calls.clear()
        try:
            cache = _run(model)
        except Exception as error:
            raise ExportError(f"{type(model).__name__} does not run one eager step over transformers' static cache: "
                              f"{type(error).__name__}: {first_line(error)}") from error
    shapes = tuple((layer.num_heads, layer.k_head_dim, layer.v_head_dim)
                   if isinstance(layer, CacheLayerMixin) and layer.is_initialized else None for layer in cache.layers)
    return Probe(shapes, bool(calls), tuple(_states_written(layer) for layer in cache.layers))


def _states_written(layer):
    if not isinstance(layer, LinearAttentionCacheLayerMixin):
        return None
    return {kind: [(tuple(state.shape), state.dtype) for state in states.values() if state is not None]
            for kind, states in (("conv", layer.conv_states), ("recurrent", layer.recurrent_states))}


def _run(model):
    """The step, over a static cache it allocates as it writes; the cache."""
    cache = StaticCache(config=model.config.get_text_config(), max_cache_len=1)
    with attention_implementation(model, _PROBE), batched_experts(model), recurrent_kernels(model), torch.no_grad():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long), **{cache_keyword(model): cache}, use_cache=True,
              cache_position=torch.arange(1))
    return cache


def _run_fake(model):
    """``_run`` on fake tensors: only shapes are computed, so no weight is read (a
    checkpoint's mapped pages stay on disk, deferred quantized values stay unmade)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return _run(model)


@contextlib.contextmanager
def attention_implementation(model, name: str):
    """``model``'s attention set to the registered implementation ``name`` for the block,
    its own setting restored after: on its config and on every config its modules read
    (a draft of a model's first layers, ``etmlx.llm.draft``, has a config of its own, its
    layers the model's)."""
    configs = {id(config): config for config in
               [model.config, *(getattr(module, "config", None) for module in model.modules())]
               if hasattr(config, "_attn_implementation")}
    before = {key: config._attn_implementation for key, config in configs.items()}
    for config in configs.values():
        config._attn_implementation = name
    try:
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = before[key]


def fit_to_attention(cached, model) -> None:
    """Reallocates the layers of ``cached.static_cache`` (a
    ``TorchExportableModuleWithStaticCache``'s) whose shapes differ from those ``model``'s
    attention writes, and registers the new tensors under the buffer names it gave them."""
    for i, (layer, shape) in enumerate(zip(cached.static_cache.layers, probe(model).layer_shapes)):
        if shape is None or layer.keys.numel() == 0:
            continue
        if (layer.keys.shape[1], layer.keys.shape[-1], layer.values.shape[-1]) == shape:
            continue
        heads, key_size, value_size = shape
        batch, dtype = layer.keys.shape[0], layer.keys.dtype
        layer.lazy_initialization(torch.zeros(batch, heads, 0, key_size, dtype=dtype),
                                  torch.zeros(batch, heads, 0, value_size, dtype=dtype))
        cached.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
        cached.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
