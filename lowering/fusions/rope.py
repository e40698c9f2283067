"""Rotary position embeddings as transformers writes them for Llama, Qwen, Mistral and
most decoder LMs, ``x * cos + rotate_half(x) * sin``, as one ``Rope`` node
(``mx.fast.rope``). Matched at the add, only when every piece is that computation:

- ``rotate_half(x)`` is ``cat(-x[..., D/2:], x[..., :D/2])`` of the same ``x`` (D even);
- ``cos`` and ``sin`` are of the same angles, scaled by nothing but 1, cast at most to
  ``x``'s dtype, and shaped (1, ..., T, D) against ``x``'s (..., T, D);
- the angles are ``cat(f, f)`` in float32, where ``f`` is the positions, converted to
  float32, times a constant ``inv_freq`` of D/2 values;
- the positions are ``start + arange(T)``, ``start`` an integer tensor of one element
  and T ``x``'s size on axis -2: what MLX computes from its ``offset``.

MLX's angles are ``position / freqs``, computed as ``position * reciprocal(freqs)``;
``freqs`` is chosen at export so that the float32 reciprocal gives back ``inv_freq``
bit for bit (if some value has no such ``freqs``, nothing fuses). The result then
differs from the composed computation only in how sine and cosine are evaluated.
"""

from typing import Optional

import numpy as np
import torch
from torch import fx

from etmlx.serializer.generated.etmlx_ir import Rope

from ..arguments import bind
from ..registry import is_call
from ..rules.common import dtype_of, normalize_axis, rank_of, same_size, shape_of

NAME = "rotary embedding -> mx.fast.rope"

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_RESHAPES = ("aten::unsqueeze_copy", "aten::view_copy", "aten::unsqueeze", "aten::view", "aten::reshape")
_CASTS = ("aten::_to_copy", "dim_order_ops::_to_dim_order_copy")


def _both_orders(node):
    args = bind(node)
    return ((args.self, args.other), (args.other, args.self))


def _through(node, names):
    """``node``'s operand after every call of ``names`` it was made by."""
    while is_call(node, *names):
        node = bind(node).self
    return node


def match(ctx, node):
    """``(x, start, inv_freq)`` when ``node`` is that add, else None."""
    if not is_call(node, "aten::add.Tensor") or bind(node).alpha != 1:
        return None
    for straight, turned in _both_orders(node):
        if not (is_call(straight, "aten::mul.Tensor") and is_call(turned, "aten::mul.Tensor")):
            continue
        for x, cos in _both_orders(straight):
            for half_turn, sin in _both_orders(turned):
                parts = _rotation_of(ctx, x, cos, half_turn, sin)
                if parts is not None:
                    return parts
    return None


def emit(ctx, node, parts) -> None:
    """One ``freqs`` slot for all the Rope nodes with the same frequencies: the runtimes
    share the angles of nodes that read the same offset and frequency slots."""
    x, start, freqs = parts
    freqs_slot = ctx.once(("rope freqs", freqs.numpy().tobytes()), lambda: ctx.add_constant(freqs))
    rope = ctx.emit(Rope, x=ctx.tensor(x), dims=shape_of(x)[-1], offset=ctx.tensor(start), freqs=freqs_slot)
    ctx.bind(node, rope)


def _rotation_of(ctx, x, cos, half_turn, sin):
    if not isinstance(x, fx.Node) or dtype_of(x) not in _FLOATS or rank_of(x) < 3:
        return None
    width = shape_of(x)[-1]
    if not isinstance(width, int) or width % 2 or not _turns_half(half_turn, x, width // 2):
        return None
    angles = _angles(ctx, cos, "aten::cos", x)
    if angles is None or angles is not _angles(ctx, sin, "aten::sin", x):
        return None
    parts = _positions_and_frequencies(ctx, angles, x)
    if parts is None:
        return None
    start, inv_freq = parts
    freqs = _reciprocals_that_round_trip(inv_freq)
    return None if freqs is None else (x, start, freqs)


def _turns_half(node, x, half: int) -> bool:
    """``node`` is ``cat(-x[..., half:], x[..., :half], dim=-1)``."""
    if not is_call(node, "aten::cat") or normalize_axis(bind(node).dim, rank_of(node)) != rank_of(x) - 1:
        return False
    pieces = bind(node).tensors
    if len(pieces) != 2 or not is_call(pieces[0], "aten::neg"):
        return False
    return _is_slice(bind(pieces[0]).self, x, half, None) and _is_slice(pieces[1], x, 0, half)


def _is_slice(node, x, start: int, stop: Optional[int]) -> bool:
    """``node`` is ``x[..., start:stop]`` over the last axis (``stop`` None: to the end)."""
    if not is_call(node, "aten::slice_copy.Tensor", "aten::slice.Tensor"):
        return False
    args = bind(node)
    end = shape_of(x)[-1]
    if not isinstance(args.end, int) or not isinstance(args.start, (int, type(None))):
        return False
    stop_ok = args.end >= end if stop is None else args.end == stop
    return (
        args.self is x and normalize_axis(args.dim, rank_of(x)) == rank_of(x) - 1
        and (args.start or 0) == start and stop_ok and args.step == 1
    )


def _angles(ctx, node, function: str, x):
    """The angles ``node`` is ``function`` of, when ``node`` is that, times 1, at most
    cast to ``x``'s dtype, reshaped to (1, ..., T, D) for ``x`` (..., T, D)."""
    if not isinstance(node, fx.Node) or dtype_of(node) != dtype_of(x) or rank_of(node) > rank_of(x):
        return None
    if not _is_rows_of(node, x, shape_of(x)[-1]):
        return None
    node = _through(node, _RESHAPES)
    if is_call(node, *_CASTS):
        node = bind(node).self
    if is_call(node, "aten::mul.Tensor"):
        factors = [(a, b) for a, b in _both_orders(node) if _is_one(ctx, b)]
        node = factors[0][0] if factors else node
    if not is_call(node, function):
        return None
    angles = bind(node).self
    return angles if _is_rows_of(angles, x, shape_of(x)[-1]) else None


def _is_rows_of(node, x, width) -> bool:
    """``node``'s shape is (1, ..., T, width), T the size of ``x``'s axis -2."""
    shape = shape_of(node)
    return (
        len(shape) >= 2 and all(same_size(size, 1) for size in shape[:-2])
        and same_size(shape[-2], shape_of(x)[-2]) and same_size(shape[-1], width)
    )


def _is_one(ctx, node) -> bool:
    return ctx.is_constant(node) and ctx.constant_values[node].numel() == 1 and ctx.constant_values[node].item() == 1


def _positions_and_frequencies(ctx, angles, x):
    """``(start, inv_freq)`` when ``angles`` is ``cat(f, f, dim=-1)`` with ``f`` the
    positions ``start + arange(T)`` in float32 times the constant ``inv_freq``."""
    if not is_call(angles, "aten::cat") or dtype_of(angles) != torch.float32:
        return None
    halves = bind(angles).tensors
    if normalize_axis(bind(angles).dim, rank_of(angles)) != rank_of(angles) - 1 or len(halves) != 2:
        return None
    if halves[0] is not halves[1] or not is_call(halves[0], "aten::mul.Tensor"):
        return None
    half = shape_of(x)[-1] // 2
    for positions, inv_freq in _both_orders(halves[0]):
        if not ctx.is_constant(inv_freq) or dtype_of(inv_freq) != torch.float32:
            continue
        values = ctx.constant_values[inv_freq]
        if values.numel() != half or not all(size == 1 for size in values.shape[:-1]):
            continue
        start = _start_of(positions, x)
        if start is not None:
            return start, values.reshape(half)
    return None


def _start_of(node, x):
    """``start`` when ``node`` is ``start + arange(T)`` (shaped (1, ..., T)), converted to
    float32 and shaped (1, ..., T, 1), T the size of ``x``'s axis -2; else None."""
    if dtype_of(node) != torch.float32 or not _is_rows_of(node, x, 1):
        return None
    node = _through(node, _RESHAPES)
    if not is_call(node, *_CASTS):
        return None
    node = _through(bind(node).self, _RESHAPES)
    if not is_call(node, "aten::add.Tensor") or bind(node).alpha != 1 or dtype_of(node) not in (torch.int64, torch.int32):
        return None
    shape = shape_of(node)
    if not all(same_size(size, 1) for size in shape[:-1]) or not same_size(shape[-1], shape_of(x)[-2]):
        return None
    for counted, start in _both_orders(node):
        if _is_count_from_zero(_through(counted, _RESHAPES)) and _is_one_integer(start):
            return start
    return None


def _is_one_integer(node) -> bool:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype in (torch.int64, torch.int32) and value.numel() == 1


def _is_count_from_zero(node) -> bool:
    if not is_call(node, "aten::arange.start_step", "aten::arange", "aten::arange.start"):
        return False
    args = bind(node)
    return args.get("start", 0) == 0 and args.get("step", 1) == 1


def _reciprocals_that_round_trip(inv_freq: torch.Tensor) -> Optional[torch.Tensor]:
    """For each ``a`` of ``inv_freq``, a float32 ``f`` with ``float32(1 / f) == a``
    (IEEE division, as MLX's reciprocal computes it), or None if some ``a`` has none."""
    wanted = inv_freq.numpy().astype(np.float32)
    nearest = (1 / wanted.astype(np.float64)).astype(np.float32)
    chosen = nearest.copy()
    for i, (a, f) in enumerate(zip(wanted, nearest)):
        candidates = (f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(0)))
        found = [c for c in candidates if np.isfinite(c) and np.float32(1) / c == a]
        if not found:
            return None
        chosen[i] = found[0]
    return torch.from_numpy(chosen)
