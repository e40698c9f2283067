"""The CPU forms of runtime_shim/mlx_ops/cpu_math.py against MLX's own functions
(the native backend's twins run through the exported programs of tests/lowering)."""

import math

import mlx.core as mx
import numpy as np
import pytest

from etmlx.runtime_shim.mlx_ops import cpu_math


def _normal(*shape, dtype=mx.float32):
    return (mx.random.normal(shape, key=mx.random.key(sum(shape))) * 3).astype(dtype)


def _close(actual: mx.array, expected: mx.array, tolerance: float) -> None:
    actual, expected = np.array(actual.astype(mx.float32)), np.array(expected.astype(mx.float32))
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, equal_nan=True)


def test_softmax_is_mlx_precise_softmax_to_float32_rounding():
    x = _normal(3, 5, 40)
    x = mx.concatenate([x, mx.full((3, 5, 1), -math.inf)], axis=-1)  # a key no query may see
    rows = mx.array([[-math.inf, -math.inf], [math.nan, 0.0], [0.0, math.inf], [-1e30, 1e30]])
    for value, axis in ((x, -1), (x, 1), (rows, -1)):
        _close(cpu_math.softmax(value, axis), mx.softmax(value, axis=axis, precise=True), 2e-6)
    half = x.astype(mx.float16)
    got = cpu_math.softmax(half, -1)
    assert got.dtype == mx.float16
    _close(got, mx.softmax(half, axis=-1, precise=True), 1e-3)


GROUPED = dict(q=(2, 8, 5, 16), kv=(2, 2, 7, 16))  # 4 query heads to a key's


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "additive", "broadcast bool"])
@pytest.mark.parametrize("heads", ["equal", "grouped"])
def test_attention_is_mlx_fallback_with_this_softmax(dtype, mask, heads):
    q_shape, kv_shape = ((2, 4, 6, 16), (2, 4, 6, 16)) if heads == "equal" else (GROUPED["q"], GROUPED["kv"])
    q, k, v = _normal(*q_shape, dtype=dtype), _normal(*kv_shape, dtype=dtype), _normal(*kv_shape, dtype=dtype)
    scores_shape = (q_shape[0], q_shape[1], q_shape[2], kv_shape[2])
    masks = {"none": None, "causal": "causal",
             "bool": mx.random.uniform(shape=scores_shape, key=mx.random.key(1)) > 0.3,
             "additive": mx.where(mx.random.uniform(shape=scores_shape, key=mx.random.key(2)) > 0.3, 0.0,
                                  -math.inf).astype(dtype),
             "broadcast bool": mx.arange(kv_shape[2]) < 3}
    got = cpu_math.attention(q, k, v, 0.25, masks[mask])
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=masks[mask])
    assert got.shape == expected.shape and got.dtype == expected.dtype
    _close(got, expected, 2e-6 if dtype == mx.float32 else 2e-2)


def test_attention_keeps_mlx_errors():
    q, k = _normal(2, 4, 6, 16), _normal(1, 4, 6, 16)  # a batch MLX refuses (a product would broadcast it)
    with pytest.raises(ValueError, match="mismatching batch dimension"):
        cpu_math.attention(q, k, k, 0.25, None)
    with pytest.raises(ValueError, match="n_heads must be a multiple"):
        cpu_math.attention(_normal(1, 6, 6, 16), _normal(1, 4, 6, 16), _normal(1, 4, 6, 16), 0.25, None)


def test_empty_operands_are_what_mlx_makes_of_them():
    """No keys: MLX's attention is zeros (an empty softmax times empty values); no
    queries, or an empty softmax: empty arrays."""
    q, no_keys, no_queries = _normal(1, 2, 3, 8), mx.zeros((1, 2, 0, 8)), mx.zeros((1, 2, 0, 8))
    keys = _normal(1, 2, 4, 8)
    for args in ((q, no_keys, no_keys), (no_queries, keys, keys)):
        _close(cpu_math.attention(*args, 0.5, None), mx.fast.scaled_dot_product_attention(*args, scale=0.5), 0)
    assert cpu_math.softmax(mx.zeros((2, 0)), -1).shape == (2, 0)


def test_attention_of_float64_or_mixed_dtypes_is_mlx_own():
    q = _normal(1, 2, 3, 8)
    k = _normal(1, 2, 3, 8, dtype=mx.float16)
    _close(cpu_math.attention(q, k, k, 0.5, None), mx.fast.scaled_dot_product_attention(q, k, k, scale=0.5), 0)
