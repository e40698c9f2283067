// ExecuTorch tensors in and out of MLX arrays, honouring dim order.
#pragma once

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <mlx/array.h>

namespace etmlx::native {

namespace mx = mlx::core;
using Tensor = executorch::aten::Tensor;

// A new MLX array holding a copy of `nbytes` at `data`, laid out as `shape`.
mx::array copy_array(const void* data, size_t nbytes, mx::Shape shape, mx::Dtype dtype);

// A copy of `tensor` as an MLX array of its logical shape. A copy, not a view:
// the delegate keeps arrays across calls (buffer updates may be an input),
// while ExecuTorch reuses the input's memory.
mx::array read_tensor(const Tensor& tensor);

// An output on its way to `tensor`: the array laid out in the tensor's dim
// order, made contiguous (lazily: evaluate it with the rest of the call).
struct PreparedOutput {
  mx::array data;
  mx::Shape shape;  // logical shape, for resizing the tensor
};
PreparedOutput prepare_output(const mx::array& value, const Tensor& tensor);

// Resizes `tensor` to the output's shape and copies the evaluated data in.
void write_output(const PreparedOutput& output, Tensor& tensor);

}  // namespace etmlx::native
