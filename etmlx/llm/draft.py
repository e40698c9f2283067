"""The draft of speculative decoding written into the target's own ``.pte``, so that an app
loads one file (``export-llm TARGET --draft DIR``, or ``--draft-layers N``): beside the
target's ``forward`` and ``verify``, the draft's ``draft_forward`` and constant methods
(``draft_get_max_seq_len``, ...), its KV caches under names of its own (``draft.cached.*``).
``Session(program, prefix=PREFIX)`` drives those methods of a loaded program.

``--draft-layers N`` needs no second checkpoint: the draft is the target's first N decoder
layers, then its final norm and head (``first_layers``), the same modules, so the file
stores their weights once (named data is keyed by content) and the draft costs only its
caches. Its proposals are what the target's first layers would make of the text, which a
model whose later layers refine rather than rewrite keeps often."""

import copy

from etmlx.errors import ExportError

# The name the draft's methods and buffers start with.
PREFIX = "draft"


def first_layers(model, count: int):
    """A model of ``model``'s first ``count`` decoder layers, then its final norm and head:
    the same modules (nothing copied but the objects on the way to the layers), with a
    config of ``count`` layers."""
    import torch

    text = model.config.get_text_config()
    total = text.num_hidden_layers
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count < total:
        raise ExportError(f"draft_layers={count!r}: expected 1 to {total - 1}, fewer than the model's {total} layers")
    found = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == total]
    if len(found) != 1:
        raise ExportError(f"{type(model).__name__}: draft_layers needs one list of its {total} decoder layers, "
                          f"found {len(found)}")
    config = copy.deepcopy(model.config)
    config.get_text_config().num_hidden_layers = count
    if getattr(config.get_text_config(), "layer_types", None):
        config.get_text_config().layer_types = config.get_text_config().layer_types[:count]
    configs = {id(model.config): config, id(text): config.get_text_config()}
    draft = parent = _shallow_copy(model, configs)
    *path, layers = found[0].split(".")
    for name in path:  # copies of the modules that lead to the layers, the rest shared
        child = _shallow_copy(parent._modules[name], configs)
        parent._modules[name] = child
        parent = child
    parent._modules[layers] = torch.nn.ModuleList(list(parent._modules[layers])[:count])
    return draft


def _shallow_copy(module, configs: dict):
    """``module`` as a new object holding the same parameters and submodules in a table of
    its own, its config replaced by ``configs[id(config)]``."""
    made = copy.copy(module)
    made._modules = dict(module._modules)
    if id(getattr(module, "config", None)) in configs:
        made.config = configs[id(module.config)]
    return made


def refuse_recurrent(model, role: str) -> None:
    """A model whose layers keep a recurrent state cannot go back past a rejected token."""
    from .recurrent_state import FAMILIES

    if model.config.get_text_config().model_type in FAMILIES:
        raise ExportError(f"the {role}'s layers keep a recurrent state ({model.config.get_text_config().model_type}), "
                          "which cannot go back past a rejected token: speculative decoding needs attention caches")


def methods(draft_model, max_seq_len: int, capacity: int) -> dict:
    """The draft's methods for the target's file: ``causal_lm.export_methods`` of
    ``draft_model`` over a cache of ``capacity`` tokens, its buffers and names prefixed."""
    from . import causal_lm

    refuse_recurrent(draft_model, "draft")
    exported = causal_lm.export_methods(draft_model, max_seq_len, capacity, buffer_prefix=PREFIX)
    return {f"{PREFIX}_{name}": value for name, value in exported.items()}
