"""A model of a causal LM's first decoder layers, then its final norm and head, holding the
same weights: the draft of ``--draft-layers`` (``etmlx.llm.draft``), and the model whose
trace the others' layers repeat (``etmlx.llm.repeated_layers``)."""

import copy

from etmlx.errors import ExportError


def first_layers(model, count: int):
    """A model of ``model``'s first ``count`` decoder layers, then its final norm and head:
    the same parameters and buffers, with a config of ``count`` layers that every module
    reads (a module holding the model's config is a shallow copy holding the new one: set
    on the new model, transformers' settings, such as its experts' implementation, reach
    its layers)."""
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
    *path, layers = found[0][0].split(".")
    along = {id(model.get_submodule(".".join(path[:depth]))) for depth in range(len(path) + 1)}
    short = _reading(model, configs, along)
    parent = short.get_submodule(".".join(path))  # a copy: the model's own list stays whole
    parent._modules[layers] = torch.nn.ModuleList(list(parent._modules[layers])[:count])
    return short


def layer_lists(model) -> list:
    """``[(path, ModuleList)]`` of ``model``'s lists of as many modules as its config has
    decoder layers: one, its decoder layers, in a model ``first_layers`` can cut."""
    import torch

    total = model.config.get_text_config().num_hidden_layers
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, torch.nn.ModuleList) and len(module) == total]


def _reading(module, configs: dict, along: set, made=None):
    """``module``, or a new object holding the same parameters and buffers where it holds a
    config of ``configs`` (by id; then it holds the replacement), is in ``along`` (ids of
    the modules on the way to the layers, whose list is cut), or has a submodule that is
    copied (its submodules are then ``_reading``'s of its own; a module met twice is
    copied once)."""
    made = {} if made is None else made
    if id(module) not in made:
        children = {name: None if child is None else _reading(child, configs, along, made)
                    for name, child in module._modules.items()}
        holds = id(getattr(module, "config", None)) in configs
        copied = module
        if holds or id(module) in along or any(children[name] is not child for name, child in module._modules.items()):
            copied = copy.copy(module)
            copied._modules = children
            if holds:
                copied.config = configs[id(module.config)]
        made[id(module)] = copied
    return made[id(module)]
