import mlx.core as mx
import numpy as np
import pytest
import torch

from etmlx.runtime_shim import CapacityError, TensorValue
from etmlx.runtime_shim import pte_types as t
from etmlx.runtime_shim.dtypes import from_scalar_type

FLOAT, BF16 = from_scalar_type(6), from_scalar_type(15)


def _tv(dtype=FLOAT, capacity=(4, 3), dynamism=t.DYNAMIC_BOUND, dim_order=()):
    return TensorValue(dtype, capacity, dim_order, dynamism, None)


def test_set_resizes_within_capacity():
    tv = _tv()
    tv.set(np.arange(6, dtype=np.float32), (2, 3))
    assert tv.shape == (2, 3) and tv.scalar_type == 6
    np.testing.assert_array_equal(tv.array, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_set_beyond_capacity_is_a_clear_error():
    with pytest.raises(CapacityError, match=r"shape \(5, 3\) exceeds the planned upper bound \(4, 3\)"):
        _tv().set(np.zeros((5, 3), np.float32))
    with pytest.raises(CapacityError, match="static tensor"):
        _tv(dynamism=t.STATIC).set(np.zeros((2, 3), np.float32))


def test_set_with_wrong_dtype():
    with pytest.raises(TypeError, match="cannot set a float32 tensor from a float64 array"):
        _tv().set(np.zeros((2, 3)))


def test_views_share_storage_with_alias():
    a, b = _tv(), _tv(capacity=(12,))
    a.set(np.ones((4, 3), np.float32))
    b.alias(a, (12,))
    b.array[0] = 7
    assert a.array[0, 0] == 7


def test_torch_out_is_resized_in_place():
    tv = _tv()
    out = tv.torch_out()
    torch.add(torch.ones(2, 3), 1, out=out)
    tv.sync_from_torch(out)
    assert tv.shape == (2, 3) and (tv.array == 2).all()
    with pytest.raises(RuntimeError, match="not resizable"):
        torch.add(torch.ones(5, 3), 1, out=tv.torch_out())


def test_bfloat16_round_trips_through_mlx_and_torch():
    tv = _tv(BF16, (3,))
    values = mx.array([1.5, -2.0, 0.25]).astype(mx.bfloat16)
    tv.set_mx(values)
    assert tv.array.dtype == np.uint16
    assert tv.to_mx().dtype == mx.bfloat16 and mx.array_equal(tv.to_mx(), values).item()
    assert tv.to_torch().tolist() == [1.5, -2.0, 0.25]
    tv.set(np.array([0x3F80], np.uint16), (1,))
    assert tv.item() == 1.0


def test_dim_order_is_a_permuted_view():
    tv = _tv(capacity=(1, 2, 2, 3), dynamism=t.STATIC, dim_order=(0, 2, 3, 1))
    logical = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
    tv.set(logical)
    np.testing.assert_array_equal(tv.array, logical)
    np.testing.assert_array_equal(tv.storage.view(np.float32), logical.transpose(0, 2, 3, 1).reshape(-1))
    torch.testing.assert_close(tv.to_torch(), torch.from_numpy(logical))
