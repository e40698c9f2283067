"""``quantize="int2"`` ... ``"int8"`` of ``etmlx.export``: torchao's weight-only quantization,
applied for the user before export, in the form etmlx lowers to MLX's quantized
kernels (``lowering/rules/quantized.py``); ``"mxfp4"``, ``"mxfp8"`` and ``"nvfp4"``: MLX's
float modes, by ExecuTorch's exportable configs and etmlx's ``mxfp4`` (``lowering/rules/exportables.py``)."""

import copy
import functools
import types

from etmlx.errors import ExportError

from .intx import SCHEMES, bits


def quantized_copy(module, scheme: str, group_size=64, embeddings: bool = True):
    """A copy of ``module`` (the caller's stays float) quantized by ``quantize``; returns
    (the copy, the names of the quantized layers and expert stacks)."""
    _check(scheme, group_size)
    return quantize(copy.deepcopy(module), scheme, group_size, embeddings)


def quantize(module, scheme: str, group_size=64, embeddings: bool = True, deferred: bool = False):
    """Quantizes in place the weights of ``module``'s linear layers, of its embeddings
    unless ``embeddings`` is False, and of transformers' expert stacks, to ``scheme`` per
    group of ``group_size`` values of each row; ``group_size=None`` means one group per
    row (per channel). A ``mixed_*`` scheme gives each layer one of two widths
    (``_mixed_width``). A weight several layers share (a head tied to the embedding) is
    quantized once and stays shared. Returns (``module``, the names of the quantized
    layers and expert stacks).

    A linear or embedding weight becomes what torchao's ``IntxWeightOnlyConfig`` makes of
    it (``_intx``). ``deferred``: its integer values are placeholders computed when
    lowering packs them (``lowering/deferred.py``; inside its ``scope()``), from the float
    weight, which is only read: scales and zero points are computed now."""
    import torch

    _check(scheme, group_size)
    _as_linear_layers(module)
    if scheme in FLOAT_SCHEMES:
        return _float_quantize(module, scheme, embeddings)
    kinds = (torch.nn.Linear, torch.nn.Embedding) if embeddings else (torch.nn.Linear,)
    width = _mixed_width(module, *MIXED[scheme]) if scheme in MIXED else lambda name, layer: scheme
    names, done = [], {}  # id of a float weight -> (it, held so that its id stays its own; what it became)
    kept_float = _read_by_their_owner(module)
    for name, layer in list(module.named_modules()):
        if _is_experts(layer):
            stacks = _quantize_expert_stacks(layer, lambda stack: width(f"{name}.{stack}", None), group_size)
            names += [f"{name}.{stack}".lstrip(".") for stack in stacks]
        if not isinstance(layer, kinds) or id(layer) in kept_float:
            continue
        columns = layer.weight.shape[1]
        if group_size is not None and columns % group_size:
            continue  # rows that do not divide into groups stay float
        float_weight = layer.weight
        if id(float_weight) in done:
            layer.weight = done[id(float_weight)][1]
        else:
            with torch.no_grad():
                weight = _intx(float_weight, width(name, layer), group_size, deferred)
            layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        done[id(float_weight)] = float_weight, layer.weight
        names.append(name)
    return module, names


def _as_linear_layers(module) -> None:
    """transformers' layers that compute a linear layer's product in another form become
    ``torch.nn.Linear`` layers, which the quantizer takes: ``Conv1D`` (GPT-2's ``x @ W + b``,
    ``W`` a linear weight's transpose, copied here) and ``FalconLinear`` (``x @ W.T + b``,
    whose transpose torchao's quantized weight does not offer)."""
    import torch

    from etmlx.lowering import deferred

    for name, layer in list(module.named_modules()):
        if not type(layer).__module__.startswith("transformers."):
            continue
        if type(layer).__name__ == "FalconLinear":
            layer.__class__ = torch.nn.Linear
        elif type(layer).__name__ == "Conv1D":
            linear = torch.nn.Linear(layer.nx, layer.nf, device="meta")
            linear.weight = torch.nn.Parameter(deferred.resolve(layer.weight).t().contiguous(), requires_grad=False)
            linear.bias = layer.bias
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, linear)


def _check(scheme: str, group_size) -> None:
    if scheme not in CHOICES:
        raise ExportError(f"quantize={scheme!r}: etmlx quantizes to {', '.join(CHOICES)}")
    if scheme in FLOAT_SCHEMES:
        return
    if group_size is not None and (not isinstance(group_size, int) or group_size <= 0 or group_size % 32):
        raise ExportError(f"group_size={group_size!r}: MLX takes multiples of 32 (32, 64, 128, ...)")


def _intx(weight, scheme: str, group_size, deferred: bool):
    """What torchao's ``IntxWeightOnlyConfig`` makes of a 2-d ``weight`` (its default
    symmetric mapping, int8 storage, a scale and zero point per group; ``from_hp``'s own
    calls of ``choose_qparams_affine`` and ``quantize_affine``), its integer values
    computed now, or, ``deferred``, when read: by ``intx.quantized``, or all of it by the
    worker process, where one runs (``pack_worker``)."""
    import torch
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from . import intx, pack_worker

    parts = pack_worker.submit(weight, scheme, group_size) if deferred else None
    if parts is None:
        return intx.quantized(weight, scheme, group_size, deferred)
    columns = weight.shape[1]
    block_size = (1, columns if group_size is None else group_size)
    return IntxUnpackedToInt8Tensor(*parts, getattr(torch, scheme), block_size, weight.dtype, None)


def formats(model, names) -> dict:
    """``{name: the format it runs in}`` for the quantized layers and expert stacks
    ``names`` of ``model`` (what ``quantized_copy`` returned): "int4, groups of 64",
    "int6, one group a row", "nvfp4", ..."""
    found = {}
    for name in names:
        owner, _, stack = name.rpartition(".")
        stacks = getattr(model.get_submodule(owner), "_quantized_stacks", {}) if stack in EXPERT_STACKS else {}
        if stack in stacks:
            group, bits = stacks[stack]
            found[name] = f"int{bits}, groups of {group}"
            continue
        weight = model.get_submodule(name).weight
        if hasattr(weight, "target_dtype"):  # torchao's IntxUnpackedToInt8Tensor
            group, columns = weight.block_size[-1], weight.shape[-1]
            found[name] = f"{str(weight.target_dtype).removeprefix('torch.')}, " + (
                "one group a row" if group == columns else f"groups of {group}")
        else:
            found[name] = _FLOAT_FORMATS.get(type(weight).__name__, type(weight).__name__)
    return found


_FLOAT_FORMATS = {"Mxfp4Tensor": "mxfp4", "ExportableMXTensor": "mxfp8", "ExportableNVFP4Tensor": "nvfp4"}


# Two widths per recipe, as mlx-lm's ``--quant-predicate`` recipes (after llama.cpp's *_M).
MIXED = {"mixed_2_6": ("int2", "int6"), "mixed_3_4": ("int3", "int4"), "mixed_3_6": ("int3", "int6"),
         "mixed_4_6": ("int4", "int6")}
# MLX's float modes, by ExecuTorch's exportable configs (mxfp4, which they lack: etmlx's
# own, ``etmlx/quant/mxfp4.py``): the values' group is the mode's.
FLOAT_SCHEMES = {"mxfp4": 32, "mxfp8": 32, "nvfp4": 16}
INTEGER_SCHEMES = SCHEMES + tuple(MIXED)  # torchao's integer weights (``_intx``)
CHOICES = INTEGER_SCHEMES + tuple(FLOAT_SCHEMES)  # what quantize= takes


def _read_by_their_owner(module) -> set:
    """ids of the linear layers whose owner reads their weight rather than calling them:
    ``torch.nn.MultiheadAttention``'s ``out_proj`` (its functional form transposes the
    weight, which torchao's quantized tensors do not offer; SigLIP's pooling head). They
    stay float."""
    import torch

    return {id(m.out_proj) for m in module.modules() if isinstance(m, torch.nn.MultiheadAttention)}


def _float_quantize(module, scheme: str, embeddings: bool):
    """``quantize`` in a float mode: ExecuTorch's ``ExportableMXConfig`` (FP8 E4M3
    values, a power of two per 32) or ``ExportableNVFP4Config`` (FP4 values, an FP8 scale
    per 16 and one per tensor), or for mxfp4 ``Mxfp4Tensor`` (FP4 values, a power of two
    per 32), on each linear layer (and embedding) whose rows divide into the mode's
    groups; expert stacks stay float."""
    import torch
    from torchao.quantization import quantize_

    from etmlx.lowering import deferred

    group = FLOAT_SCHEMES[scheme]
    kinds = (torch.nn.Linear, torch.nn.Embedding) if embeddings else (torch.nn.Linear,)
    rows = group if scheme == "nvfp4" else 1  # NVFP4's kernels tile rows by 16 too
    kept_float = _read_by_their_owner(module)
    names = [name for name, layer in module.named_modules()
             if isinstance(layer, kinds) and id(layer) not in kept_float
             and layer.weight.shape[0] % rows == 0 and layer.weight.shape[1] % group == 0]
    from .mxfp4 import Mxfp4Tensor

    config = None if scheme == "mxfp4" else _exportable_config(scheme)
    with torch.no_grad():
        for name in names:  # one at a time: a weight loaded in another dtype is computed as it is read
            layer = module.get_submodule(name)
            weight = deferred.resolve(layer.weight)
            if config is None:
                layer.weight = torch.nn.Parameter(Mxfp4Tensor.from_float(weight), requires_grad=False)
            else:
                layer.weight = torch.nn.Parameter(weight, requires_grad=False)
                quantize_(layer, config, filter_fn=lambda candidate, _: candidate is layer)
    return module, names


def _exportable_config(scheme: str):
    if scheme == "mxfp8":
        from executorch.extension.llm.export.mx import ExportableMXConfig

        return ExportableMXConfig()
    from executorch.extension.llm.export.nvfp4 import ExportableNVFP4Config

    return ExportableNVFP4Config()


def _mixed_width(model, low: str, high: str):
    """``(name, layer) -> scheme``: llama.cpp's Q4_K_M choice, as mlx-lm makes it: the
    high width for the output head, and for the value and down projections of the first
    and last eighth of the layers and every third layer between; the low one elsewhere.
    A head tied to the embedding keeps the table's width (one copy of it)."""
    import torch

    def index(name: str) -> int:
        return next((int(part) for part in name.split(".") if part.isdigit()), 0)

    down = [name for name, _ in model.named_modules() if "down_proj" in name]
    down += [f"{name}.down_proj" for name, layer in model.named_modules() if _is_experts(layer)]
    if not down:
        raise ExportError("mixed quantization recipes pick widths by decoder layer: this model has no down_proj")
    layers = 1 + max(index(name) for name in down)
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}

    def width(name: str, layer) -> str:
        i = index(name)
        more = i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2
        if "lm_head" in name:
            return low if layer is not None and id(layer.weight) in embedded else high
        return high if more and ("v_proj" in name or "down_proj" in name) else low

    return width


# The stacks of expert matrices (experts, out, in) of transformers' mixture-of-experts
# modules (those its ``use_experts_implementation`` sets ``has_gate`` on).
EXPERT_STACKS = ("gate_up_proj", "up_proj", "down_proj")


def _is_experts(layer) -> bool:
    import torch

    return hasattr(layer, "has_gate") and any(isinstance(getattr(layer, n, None), torch.nn.Parameter) for n in EXPERT_STACKS)


def _quantize_expert_stacks(layer, scheme_of, group_size) -> list:
    """Quantizes ``layer``'s expert stacks (stack ``s`` to ``scheme_of(s)``) as torchao
    quantizes a linear layer's rows (per group of ``group_size`` values along the last dim), kept as int8 values, scales and
    zero points; reading the stack (``layer.gate_up_proj``) dequantizes it with torchao,
    so the traced graph shows ``dequantize_affine(...)[ids]``, which etmlx lowers to
    ``mx.gather_qmm``. Returns the names of the stacks quantized."""
    import torch
    from torchao.quantization import IntxUnpackedToInt8Tensor

    from etmlx.lowering import deferred

    stacks = {}
    for stack in EXPERT_STACKS:
        weight = getattr(layer, stack, None)
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 3:
            continue
        group = weight.shape[-1] if group_size is None else group_size
        if weight.shape[-1] % group:
            continue  # rows that do not divide into groups stay float
        scheme = scheme_of(stack)
        values = deferred.resolve(weight.detach())
        q = IntxUnpackedToInt8Tensor.from_hp(values, [1, 1, group], getattr(torch, scheme))
        del layer._parameters[stack]
        for part in ("qdata", "scale", "zero_point"):
            layer.register_buffer(f"{stack}_{part}", getattr(q, part))
        stacks[stack] = (group, bits(scheme))
    if stacks:
        layer._quantized_stacks = stacks
        layer.__class__ = _dequantizing(type(layer))
    return list(stacks)


@functools.cache
def _dequantizing(cls):
    """``cls`` with its quantized expert stacks read back dequantized."""

    def __getattr__(self, name):
        stacks = self.__dict__.get("_quantized_stacks", {})
        if name not in stacks:
            return cls.__getattr__(self, name)
        from etmlx.lowering.custom_ops import dequantize_weight

        group, bits = stacks[name]
        parts = (getattr(self, f"{name}_{part}") for part in ("qdata", "scale", "zero_point"))
        return dequantize_weight(*parts, group, bits)

    return types.new_class(f"Quantized{cls.__name__}", (cls,), exec_body=lambda ns: ns.update(__getattr__=__getattr__))
