"""A language model traced with its first three layers, the others written as copies of
the third (``lowering.repeated_layers``): tracing, decomposing and checking cost time per
node, and a model's graph is its layers over and over.

Only for families whose layers after the first are the same function of their own weights
(``FAMILIES``: each generates eager's tokens so, tests/repeated.py lists where it is tested),
and only for a model whose layers after the first have the same modules, weights' shapes
and settings, and whose config gives them the same per-layer values; the graph pass then
checks the trace itself, and a model that fails any check is traced whole."""

import torch

from etmlx.lowering.repeated_layers import WholeModel

from .first_layers import layer_lists

TRACED = 3
# model_type of the families traced this way
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "granite", "olmo2", "olmo", "phi", "stablelm",
            "starcoder2", "cohere", "glm", "glm4", "ernie4_5", "apertus", "arcee",
            "mixtral", "qwen3_moe", "qwen2_moe", "olmoe")
# a layer's own index, which its modules keep (and nothing else differs by)
INDEX_ATTRIBUTES = ("layer_idx",)


def repeats(model) -> bool:
    """Whether ``model``'s layers after the first repeat (see the module's docstring)."""
    text = model.config.get_text_config()
    found = layer_lists(model)
    if text.model_type not in FAMILIES or len(found) != 1 or text.num_hidden_layers <= TRACED + 1:
        return False
    per_layer = [value for value in vars(text).values()
                 if isinstance(value, (list, tuple)) and len(value) == text.num_hidden_layers]
    if any(len({repr(item) for item in value[1:]}) > 1 for value in per_layer):
        return False
    layers = found[0][1]
    first = _form(layers[1])
    return all(_form(layer) == first for layer in layers[2:])


def whole_model(wrapper, model) -> WholeModel:
    """``WholeModel`` of ``wrapper`` (a ``windowed_cache.WindowedCausalLM`` over all of
    ``model``'s layers)."""
    [(_, layers)] = layer_lists(model)
    paths = {id(module): path for path, module in wrapper.named_modules(remove_duplicate=False)}
    cache_path = paths[id(wrapper.bindings.module)]
    index = {id(layer): i for i, layer in enumerate(wrapper.cached.static_cache.layers)}
    state = {}
    for holder, _, kind, names in wrapper.bindings.places:
        for name in names if kind == "tuple" else [names]:
            if name is not None and id(holder) in index:
                state[f"{cache_path}.{name}" if cache_path else name] = index[id(holder)]
    tensors = {**dict(wrapper.named_parameters(remove_duplicate=False)),
               **dict(wrapper.named_buffers(remove_duplicate=False))}
    return WholeModel(paths[id(layers)], state, tensors)


def _form(layer) -> tuple:
    """What must be equal for two layers to compute the same function of their weights:
    each module's class and plain settings (but its index), each tensor's ``_described``."""
    form = []
    for path, module in layer.named_modules():
        settings = sorted((key, repr(value)) for key, value in vars(module).items()
                          if not key.startswith("_") and key not in INDEX_ATTRIBUTES and _plain(value))
        tensors = [(name, _described(tensor))
                   for name, tensor in [*module._parameters.items(), *module._buffers.items()] if tensor is not None]
        form.append((path, type(module).__qualname__, tuple(settings), tuple(tensors)))
    return tuple(form)


def _described(tensor) -> tuple:
    """A tensor's kind, shape and dtype; a subclass's (torchao's quantized weights) also
    its settings (bits, block size) and its inner tensors': a GGUF file's Q4_K_M mixes
    widths across layers in tensors of one class and shape."""
    described = (type(tensor).__name__, tuple(tensor.shape), tensor.dtype)
    if type(tensor) is torch.Tensor or not hasattr(tensor, "__tensor_flatten__"):
        return described
    names, settings = tensor.__tensor_flatten__()
    return described + (repr(settings), tuple(_described(getattr(tensor, name)) for name in names))


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))
