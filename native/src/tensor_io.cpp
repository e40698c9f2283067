#include "tensor_io.h"

#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <mlx/allocator.h>
#include <mlx/ops.h>

#include "dtypes.h"
#include "errors.h"

namespace etmlx::native {

namespace {

std::vector<int> dim_order(const Tensor& tensor) {
  const auto order = tensor.dim_order();
  return std::vector<int>(order.begin(), order.end());
}

bool is_identity(const std::vector<int>& permutation) {
  for (size_t i = 0; i < permutation.size(); ++i) {
    if (permutation[i] != static_cast<int>(i)) {
      return false;
    }
  }
  return true;
}

std::string shape_text(const mx::Shape& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

mx::array copy_array(const void* data, size_t nbytes, mx::Shape shape, mx::Dtype dtype) {
  if (nbytes == 0) {
    return mx::zeros(shape, dtype);
  }
  auto memory = mx::allocator::malloc(nbytes);
  auto buffer = memory.buffer();
  std::memcpy(buffer.raw_ptr(), data, nbytes);
  return mx::array(std::move(memory), std::move(shape), dtype);
}

mx::array read_tensor(const Tensor& tensor) {
  const auto dtype = mlx_dtype(tensor.scalar_type());
  if (!dtype) {
    throw InputError("tensor of scalar type " + std::to_string(static_cast<int>(tensor.scalar_type())) +
                     ", which MLX does not have");
  }
  const auto order = dim_order(tensor);
  mx::Shape physical;
  for (int dim : order) {
    physical.push_back(static_cast<int>(tensor.size(dim)));
  }
  auto array = copy_array(tensor.const_data_ptr(), tensor.nbytes(), physical, *dtype);
  if (is_identity(order)) {
    return array;
  }
  std::vector<int> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    inverse[order[i]] = static_cast<int>(i);
  }
  return mx::transpose(array, inverse);
}

PreparedOutput prepare_output(const mx::array& value, const Tensor& tensor) {
  const auto dtype = mlx_dtype(tensor.scalar_type());
  if (!dtype || *dtype != value.dtype()) {
    throw FormatError("the delegate computes " + dtype_name(value.dtype()) + ", the program's tensor holds " +
                      (dtype ? dtype_name(*dtype) : "a type MLX does not have"));
  }
  const auto order = dim_order(tensor);
  if (order.size() != value.ndim()) {
    throw FormatError("the delegate computes a " + std::to_string(value.ndim()) + "-d array, the program's tensor is " +
                      std::to_string(order.size()) + "-d");
  }
  const auto physical = is_identity(order) ? value : mx::transpose(value, order);
  return {mx::contiguous(physical), value.shape()};
}

void write_output(const PreparedOutput& output, Tensor& tensor) {
  std::vector<executorch::aten::SizesType> sizes(output.shape.begin(), output.shape.end());
  const auto resized = executorch::runtime::resize_tensor(tensor, {sizes.data(), sizes.size()});
  if (resized != executorch::runtime::Error::Ok) {
    throw FormatError("the delegate computes shape " + shape_text(output.shape) +
                      ", which the program's tensor cannot hold");
  }
  if (output.data.nbytes() != tensor.nbytes()) {
    throw FormatError("output of " + std::to_string(output.data.nbytes()) + " bytes for a tensor of " +
                      std::to_string(tensor.nbytes()));
  }
  if (tensor.nbytes() > 0) {
    std::memcpy(tensor.mutable_data_ptr(), output.data.data<uint8_t>(), tensor.nbytes());
  }
}

}  // namespace etmlx::native
