// Functions MLX's CPU backend computes slowly, as products and sums that
// mx::compile fuses into one loop: the same operations in the same order as the
// Python runtime's runtime_shim/mlx_ops/cpu_math.py, so both agree to the bit.
#pragma once

#include <optional>
#include <vector>

#include <mlx/array.h>

#include "etmlx_ir_generated.h"

namespace etmlx::native::cpu_math {

// erf as x * P(x*x) / Q(x*x) (serializer/fit_erf.py), in float32.
mlx::core::array rational_erf(const mlx::core::array& x);

// e^x as 2^k * e^r, r = x - k ln 2, e^r a Taylor polynomial, in float32; 0 where the
// result would be subnormal, inf past float32's range, NaN kept.
mlx::core::array exp_by_parts(const mlx::core::array& x);

// mx::fast::gated_delta_update over many tokens as matrix products, chunk by chunk
// (MLX's CPU runs the rule a token at a time): {output, final state}. Shapes as
// GatedDelta's, checked by the caller; float32.
std::vector<mlx::core::array> gated_delta_chunks(mlx::core::array q, mlx::core::array k, const mlx::core::array& v,
                                                 const mlx::core::array& gamma, const mlx::core::array& beta,
                                                 const mlx::core::array& state);

// The op's faster form for `x` on MLX's CPU, or nothing where MLX's own is used.
std::optional<mlx::core::array> unary(etmlx_ir::UnaryOp op, const mlx::core::array& x);

}  // namespace etmlx::native::cpu_math
