// The dtypes of the three type systems the backend sits between: the IR's,
// MLX's and ExecuTorch's.
#pragma once

#include <optional>
#include <string>

#include <executorch/runtime/core/portable_type/scalar_type.h>
#include <mlx/dtype.h>

#include "etmlx_ir_generated.h"

namespace etmlx::native {

namespace mx = mlx::core;
using ScalarType = executorch::runtime::etensor::ScalarType;

// The MLX dtype of an IR dtype; the reader has checked the enum is known.
mx::Dtype mlx_dtype(etmlx_ir::DType dtype);

// The MLX dtype of an ExecuTorch tensor's scalar type, if MLX has it.
std::optional<mx::Dtype> mlx_dtype(ScalarType type);

// The IR dtype of an MLX dtype, if the IR has it.
std::optional<etmlx_ir::DType> ir_dtype(mx::Dtype dtype);

std::string dtype_name(mx::Dtype dtype);

}  // namespace etmlx::native
