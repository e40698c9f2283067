"""Hugging Face causal LMs exported for generation with attention over the filled part of
the KV cache only.

transformers' ``TorchExportableModuleForDecoderOnlyLM`` attends over the whole static
cache at every step (its mask hides the empty slots), so a decode step at position 10
costs what one at position 4000 does. The methods exported here take one more input,
``window``: a tensor whose length L (its values are unused) is the number of cache slots
attention reads. Keys, values and the mask are sliced to the first L slots before
attention. That gives the logits of the whole-cache form because the causal mask hides
every slot after the last position written, so nothing past it is read either way; L
only has to exceed that position. The graph checks that it does (the last position
indexes ``arange(L)``, an index both runtimes bound-check), so a window too short raises
an ``IndexError`` instead of returning other numbers.

L is a dynamic dimension, and the runtimes compile one graph per distinct input shape:
``window`` rounds L up to a multiple of ``WINDOW_STEP`` so a generation of n tokens
compiles about n / WINDOW_STEP graphs, each replayed for the steps after it.
"""

import warnings

import numpy as np

from .errors import ExportError

WINDOW_STEP = 256


def window(filled: int, capacity: int, step: int = WINDOW_STEP) -> np.ndarray:
    """The ``window`` input for a call after which the first ``filled`` cache slots hold
    tokens (the last position written plus one): ``filled`` rounded up to a multiple of
    ``step``, at most ``capacity``."""
    if not 1 <= filled <= capacity:
        raise ValueError(f"filled={filled}: expected 1 to {capacity}, the slots of the cache")
    return np.zeros(min(capacity, -(-filled // step) * step), dtype=np.bool_)


def cache_capacity(path) -> int:
    """The KV-cache capacity (tokens) of a ``.pte`` written from ``export_methods``: the size
    of its ``window`` input. For a tensor-parallel directory, of its ranks'."""
    from .inspection import inspect_program
    from .tensor_parallel import is_tensor_parallel, rank_file

    pte = rank_file(path, 0) if is_tensor_parallel(path) else path
    return inspect_program(pte)["methods"]["decode"]["inputs"][2]["sizes"][0]


def export_methods(model, max_prompt: int = 32, max_cache_len=None) -> dict:
    """``{"prefill": ..., "decode": ...}`` ExportedPrograms of a Hugging Face causal LM
    over one static KV cache (for ``etmlx.export_methods``). Both take ``(input_ids,
    cache_position, window)``: prefill 2 to ``max_prompt`` tokens, decode one; the cache
    holds ``max_cache_len`` tokens (default: the model's ``generation_config``)."""
    import torch
    from torch.export import Dim

    from .windowed_cache import WindowedCausalLM, attends_through_window, batched_experts, windowed_attention

    module = WindowedCausalLM(model, max_cache_len)
    capacity = module.capacity
    if not 2 <= max_prompt <= capacity:
        raise ExportError(f"max_prompt={max_prompt}: expected 2 to the cache's {capacity} tokens")
    seq, slots = Dim("seq", min=2, max=max_prompt), Dim("window", min=1, max=capacity)
    prompt = min(4, max_prompt)
    examples = {
        "prefill": ((torch.zeros(1, prompt, dtype=torch.long), torch.arange(prompt)), ({1: seq}, {0: seq})),
        "decode": ((torch.zeros(1, 1, dtype=torch.long), torch.tensor([0])), (None, None)),
    }
    methods = {}
    with windowed_attention(model), batched_experts(model), torch.no_grad(), warnings.catch_warnings():
        # transformers' output-capturing global trips a dynamo side-effect warning
        warnings.filterwarnings("ignore", message="While compiling, we found certain side effects")
        for name, (inputs, shapes) in examples.items():
            methods[name] = torch.export.export(
                module, (*inputs, torch.zeros(capacity, dtype=torch.bool)),
                dynamic_shapes=(*shapes, {0: slots}), strict=True,
            )
            if not attends_through_window(methods[name]):
                raise ExportError(
                    f"{type(model).__name__} does not call attention through transformers' AttentionInterface, "
                    "so it cannot read a window of its cache; export it with "
                    "TorchExportableModuleForDecoderOnlyLM (whole-cache attention) instead"
                )
    return methods
