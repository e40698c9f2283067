"""``quantize="int4" | "int8"`` of ``etmlx.export``: torchao's weight-only quantization,
applied for the user before export, in the form etmlx lowers to MLX's quantized
kernels (``lowering/rules/quantized.py``)."""

import copy

from .errors import ExportError

SCHEMES = ("int4", "int8")


def quantized_copy(module, scheme: str, group_size=64, embeddings: bool = True):
    """A copy of ``module`` (the caller's stays float) with the weights of its linear
    layers, and of its embeddings unless ``embeddings`` is False, quantized to ``scheme``
    per group of ``group_size`` values of each row; ``group_size=None`` means one group
    per row (per channel). Returns (the copy, the names of the quantized layers)."""
    import torch
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if scheme not in SCHEMES:
        raise ExportError(f"quantize={scheme!r}: etmlx quantizes to {' or '.join(SCHEMES)}")
    if group_size is not None and (not isinstance(group_size, int) or group_size <= 0 or group_size % 32):
        raise ExportError(f"group_size={group_size!r}: MLX takes multiples of 32 (32, 64, 128, ...)")
    kinds = (torch.nn.Linear, torch.nn.Embedding) if embeddings else (torch.nn.Linear,)
    quantized = copy.deepcopy(module)
    names = []
    for name, layer in quantized.named_modules():
        if not isinstance(layer, kinds):
            continue
        columns = layer.weight.shape[1]
        if group_size is not None and columns % group_size:
            continue  # rows that do not divide into groups stay float
        granularity = PerAxis(0) if group_size is None else PerGroup(group_size)
        config = IntxWeightOnlyConfig(weight_dtype=getattr(torch, scheme), granularity=granularity)
        quantize_(layer, config, filter_fn=lambda candidate, _: candidate is layer)
        names.append(name)
    return quantized, names
