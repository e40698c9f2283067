"""The cache layers' tensors, bound to their module's buffers as they are during a call.

torch.export's non-strict tracer swaps a module's registered buffers for traced tensors
for the length of the trace, but transformers' cache layers (and etmlx's ring, recurrent
and quantized layers) hold the same tensors as attributes, lists, dicts and tuples of
their own, which it does not see: a call would read and write the real tensors, which
the trace would then lift as constants aliasing the buffers (and ``run_decompositions``
fails: "expected compiled_fn to be GraphModule"). ``CacheBindings`` finds once where
each layer holds one of the module's buffers, and for each call points those places at
the buffers the module holds then (the traced ones while tracing), putting back what
was there after the call.
"""

import torch


class CacheBindings:
    """Where the objects in ``holders`` hold a buffer of ``module`` (by identity): an
    attribute, an item of a list or dict, or an item of a tuple attribute."""

    def __init__(self, module: torch.nn.Module, holders):
        names = {id(buffer): name for name, buffer in module.named_buffers(remove_duplicate=False)}
        self.module = module
        self.places = []  # (container, key, kind, buffer name or [names of a tuple's items])
        for holder in holders:
            for attribute, value in vars(holder).items():
                if isinstance(value, torch.Tensor) and id(value) in names:
                    self.places.append((holder, attribute, "attribute", names[id(value)]))
                elif isinstance(value, tuple) and any(id(item) in names for item in value):
                    self.places.append((holder, attribute, "tuple", [names.get(id(item)) for item in value]))
                elif isinstance(value, (list, dict)):
                    items = value.items() if isinstance(value, dict) else enumerate(value)
                    self.places.extend((value, key, "item", names[id(item)])
                                       for key, item in items if id(item) in names)

    def bind(self) -> list:
        """Points every place at the module's buffer of its name; returns what they held."""
        buffers = dict(self.module.named_buffers(remove_duplicate=False))
        held = []
        for container, key, kind, name in self.places:
            held.append(self._get(container, key, kind))
            if kind == "tuple":
                value = tuple(buffers[n] if n is not None else item for n, item in zip(name, held[-1]))
            else:
                value = buffers[name]
            self._set(container, key, kind, value)
        return held

    def unbind(self, held: list) -> None:
        """Puts back what ``bind`` returned."""
        for (container, key, kind, _), value in zip(self.places, held):
            self._set(container, key, kind, value)

    @staticmethod
    def _get(container, key, kind):
        return container[key] if kind == "item" else getattr(container, key)

    @staticmethod
    def _set(container, key, kind, value) -> None:
        if kind == "item":
            container[key] = value
        else:
            setattr(container, key, value)
