// Matrix products of half-precision operands on the CPU, for Matmul, Addmm and the
// dequantized QuantizedMatmul (runtime_shim/mlx_ops/matmul.py does the same).
#pragma once

#include <mlx/ops.h>

namespace etmlx::native {

namespace mx = mlx::core;

// MLX's CPU matmul of bfloat16 or float16 operands is a scalar loop: at 128 rows of 2048
// by 8192 columns, bfloat16 took 780 ms and float32 (BLAS) 80. From this many rows of a
// on, the CPU multiplies in float32 and rounds the product back once (both accumulate in
// float32; about 1 value in 4000 lands one rounding apart) (docs/architecture.md, "MLX traps").
constexpr int kCpuWidenedRows = 8;

// Whether x is bfloat16 or float16 on the CPU, where MLX's products of it are slow.
inline bool half_on_cpu(const mx::array& x) {
  return mx::default_device() == mx::Device::cpu && (x.dtype() == mx::bfloat16 || x.dtype() == mx::float16);
}

inline bool widened_on_cpu(const mx::array& a, const mx::array& b) {
  return half_on_cpu(a) && b.dtype() == a.dtype() && a.ndim() >= 2 && a.shape(-2) >= kCpuWidenedRows;
}

// a @ b, widened where widened_on_cpu says.
inline mx::array product(const mx::array& a, const mx::array& b) {
  if (widened_on_cpu(a, b)) {
    return mx::astype(mx::matmul(mx::astype(a, mx::float32), mx::astype(b, mx::float32)), a.dtype());
  }
  return mx::matmul(a, b);
}

}  // namespace etmlx::native
