// The run-time index bounds checks of a delegate: what each CheckIndex node
// checks, and the check itself, made on the host once a call is evaluated.
//
// A verdict computed in the graph would cost reductions on every call; reading a
// token id or a cache position back costs next to nothing, and the indices are
// evaluated anyway, since a gather reads them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <mlx/array.h>

#include "etmlx_ir_generated.h"

namespace etmlx::native {

namespace mx = mlx::core;

class IndexCheck {
 public:
  explicit IndexCheck(const etmlx_ir::CheckIndex& op);

  // The size of the axis, when the payload states it; otherwise the call
  // reports it with the indices.
  const std::optional<int64_t>& static_size() const { return static_size_; }

  // Throws IndexRangeError, in PyTorch's terms, when an element of `indices` (an
  // evaluated integer array, any strides) is outside the axis of `size` elements.
  void verify(const mx::array& indices, int64_t size) const;

 private:
  std::string what_;
  bool wraps_;
  std::optional<int64_t> static_size_;
};

}  // namespace etmlx::native
