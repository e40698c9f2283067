// The expert indices of GatherMm and GatherQmm, made safe to gather with.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <mlx/ops.h>

namespace etmlx::native {

namespace mx = mlx::core;

// `indices` clamped into [0, experts): MLX reads whatever memory an index points at
// (lowering only fuses indices that are in range by construction, a router's top-k).
inline mx::array clamped_expert_indices(mx::array indices, int64_t experts, const std::string& what) {
  if (!mx::issubdtype(indices.dtype(), mx::integer)) {
    throw std::invalid_argument(what + " indices must be integers");
  }
  if (experts <= 0) {
    throw std::invalid_argument(what + " over a stack of no matrices");
  }
  if (indices.dtype() != mx::int32 && indices.dtype() != mx::int64) {
    indices = mx::astype(indices, mx::int64);
  }
  const auto dtype = indices.dtype();
  return mx::clip(indices, mx::array(0, dtype), mx::array(experts - 1, dtype));
}

}  // namespace etmlx::native
