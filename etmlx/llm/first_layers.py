"""A model of a causal LM's first decoder layers, then its final norm and head, holding the
same modules: the draft of ``--draft-layers`` (``etmlx.llm.draft``), and the model whose
trace the others' layers repeat (``etmlx.llm.repeated_layers``)."""

import copy

from etmlx.errors import ExportError


def first_layers(model, count: int):
    """A model of ``model``'s first ``count`` decoder layers, then its final norm and head:
    the same modules (nothing copied but the objects on the way to the layers), with a
    config of ``count`` layers."""
    import torch

    text = model.config.get_text_config()
    total = text.num_hidden_layers
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count < total:
        raise ExportError(f"draft_layers={count!r}: expected 1 to {total - 1}, fewer than the model's {total} layers")
    found = layer_lists(model)
    if len(found) != 1:
        raise ExportError(f"{type(model).__name__}: draft_layers needs one list of its {total} decoder layers, "
                          f"found {len(found)}")
    config = copy.deepcopy(model.config)
    config.get_text_config().num_hidden_layers = count
    if getattr(config.get_text_config(), "layer_types", None):
        config.get_text_config().layer_types = config.get_text_config().layer_types[:count]
    configs = {id(model.config): config, id(text): config.get_text_config()}
    draft = parent = _shallow_copy(model, configs)
    *path, layers = found[0][0].split(".")
    for name in path:  # copies of the modules that lead to the layers, the rest shared
        child = _shallow_copy(parent._modules[name], configs)
        parent._modules[name] = child
        parent = child
    parent._modules[layers] = torch.nn.ModuleList(list(parent._modules[layers])[:count])
    return draft


def layer_lists(model) -> list:
    """``[(path, ModuleList)]`` of ``model``'s lists of as many modules as its config has
    decoder layers: one, its decoder layers, in a model ``first_layers`` can cut."""
    import torch

    total = model.config.get_text_config().num_hidden_layers
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, torch.nn.ModuleList) and len(module) == total]


def _shallow_copy(module, configs: dict):
    """``module`` as a new object holding the same parameters and submodules in a table of
    its own, its config replaced by ``configs[id(config)]``."""
    made = copy.copy(module)
    made._modules = dict(module._modules)
    if id(getattr(module, "config", None)) in configs:
        made.config = configs[id(module.config)]
    return made
