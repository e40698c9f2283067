// 0-d arrays made the way the Python runtime makes them, so both runtimes
// compute with bit-identical constants: a float goes through float32 first
// (as mlx's Python bindings convert a Python float), an integer stays exact.
#pragma once

#include <cstdint>

#include <mlx/array.h>
#include <mlx/utils.h>

namespace etmlx::native {

namespace mx = mlx::core;

inline mx::array float_scalar(double value, mx::Dtype dtype) {
  return mx::array(static_cast<float>(value), dtype);
}

// A Scalar or Full node's value: `value` for floating dtypes, `int_value` else.
inline mx::array fill_value(double value, int64_t int_value, mx::Dtype dtype) {
  return mx::issubdtype(dtype, mx::floating) ? float_scalar(value, dtype) : mx::array(int_value, dtype);
}

}  // namespace etmlx::native
