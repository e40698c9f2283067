// mlx.nn's activations, which the schema's op enums name as `nn.<name>`
// (serializer/schema.fbs), written as mlx.nn writes them (the same operations in
// the same order), so both runtimes agree to the bit.
#pragma once

#include <mlx/array.h>

namespace etmlx::native::nn {

mlx::core::array relu(const mlx::core::array& x);
mlx::core::array silu(const mlx::core::array& x);
mlx::core::array gelu(const mlx::core::array& x);         // erf form
mlx::core::array gelu_approx(const mlx::core::array& x);  // tanh form

}  // namespace etmlx::native::nn
