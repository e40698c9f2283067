// Functions MLX's CPU backend computes slowly, as products and sums that
// mx::compile fuses into one loop: the same operations in the same order as the
// Python runtime's runtime_shim/mlx_ops/cpu_math.py, so both agree to the bit.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <mlx/array.h>

#include "etmlx_ir_generated.h"

namespace etmlx::native::cpu_math {

// Whether the forms here take x's dtype (float32 and narrower; float64 and integers keep MLX's own).
bool float32_or_narrower(const mlx::core::array& x);

// erf as x * P(x*x) / Q(x*x) (serializer/fit_erf.py), in float32.
mlx::core::array rational_erf(const mlx::core::array& x);

// e^x as 2^k * e^r, r = x - k ln 2, e^r a Taylor polynomial, in float32; 0 where the
// result would be subnormal, inf past float32's range, NaN kept.
mlx::core::array exp_by_parts(const mlx::core::array& x);

// mx::softmax(x, axis, precise) as e^(x - max) over its sum, in float32, with the exp
// that vectorizes; any floating dtype but float64. An empty x is MLX's own.
mlx::core::array softmax(const mlx::core::array& x, int axis);

// mx::fast::scaled_dot_product_attention as MLX computes it on the CPU (its fallback in
// mlx/fast.cpp) with this softmax. MLX's own call still checks the operands and raises its
// errors; its result is not evaluated. Operands of several dtypes, and no keys, keep MLX's.
mlx::core::array attention(mlx::core::array q, mlx::core::array k, mlx::core::array v, float scale,
                           const std::string& mask_mode, std::optional<mlx::core::array> mask);

// mx::fast::gated_delta_update over many tokens as matrix products, chunk by chunk
// (MLX's CPU runs the rule a token at a time): {output, final state}. Shapes as
// GatedDelta's, checked by the caller; float32.
std::vector<mlx::core::array> gated_delta_chunks(mlx::core::array q, mlx::core::array k, const mlx::core::array& v,
                                                 const mlx::core::array& gamma, const mlx::core::array& beta,
                                                 const mlx::core::array& state);

// The op's faster form for `x` on MLX's CPU, or nothing where MLX's own is used.
std::optional<mlx::core::array> unary(etmlx_ir::UnaryOp op, const mlx::core::array& x);

}  // namespace etmlx::native::cpu_math
