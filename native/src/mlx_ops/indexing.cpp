// Take, TakeAlongAxis, Index and IndexPut, and the bounds check CheckIndex.
// Index and IndexPut are NumPy's advanced indexing, built from MLX's gather and
// scatter exactly as mlx's Python `x[key]`, `x[key] = v` and `x.at[key].add(v)`
// build it, for the keys the IR holds: full slices on every dimension up to the
// last indexed one, integer arrays at `dims`.
//
// Every gather and scatter clamps its indices into the axis it reads (negative
// ones counted from the end) before MLX sees them, whatever the payload holds:
// MLX reads whatever memory an index points at. CheckIndex is what reports an
// out-of-range index as PyTorch would; the clamp keeps a damaged or crafted
// payload from reading out of bounds.
#include <algorithm>
#include <array>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

// `indices` into an axis of `size` elements, made safe to gather with.
mx::array in_bounds(mx::array indices, int64_t size) {
  if (!mx::issubdtype(indices.dtype(), mx::integer)) {
    throw std::invalid_argument("indices must be integers");
  }
  if (indices.size() == 0) {
    return indices;
  }
  if (size == 0) {
    throw std::invalid_argument("indices into a dimension of size 0");
  }
  if (indices.dtype() != mx::int32 && indices.dtype() != mx::int64) {
    indices = mx::astype(indices, mx::int64);  // room for -size .. size - 1
  }
  // MLX's gathers and scatters count negative indices from the end themselves.
  // (Indices cast from floats are defined values: AsType saturates.)
  const auto dtype = indices.dtype();
  return mx::clip(indices, mx::array(-size, dtype), mx::array(size - 1, dtype));
}

int64_t axis_size(const mx::array& x, int axis) {
  const int ndim = static_cast<int>(x.ndim());
  if (axis < -ndim || axis >= ndim) {
    throw std::invalid_argument("axis " + std::to_string(axis) + " out of range for an array of " +
                                std::to_string(ndim) + " dimensions");
  }
  return x.shape(axis < 0 ? axis + ndim : axis);
}

struct AdvancedKey {
  std::vector<mx::array> indices;  // one per dimension 0 .. last indexed one
  mx::Shape index_shape;           // the broadcast shape of `indices`
  int num_dims = 0;                // how many leading dimensions the key covers
};

// Slices in between index arrays move the broadcast index shape to the front
// (NumPy's rule); adjacent index arrays keep it in place.
bool arrays_first(const std::vector<bool>& is_array) {
  bool have_array = false;
  bool have_slice_after_array = false;
  for (bool array : is_array) {
    if (array) {
      if (have_slice_after_array) {
        return true;
      }
      have_array = true;
    } else {
      have_slice_after_array = have_array;
    }
  }
  return false;
}

// `min_index_ndim`: mlx's scatter gives 0-d indices one dimension, its gather
// does not.
template <class Node>
AdvancedKey advanced_key(const Node& op, const mx::array& x, Env& env, int min_index_ndim) {
  const auto dims = ints(op.dims());
  const auto* refs = op.indices();
  if (dims.empty() || refs == nullptr || refs->size() != dims.size()) {
    throw std::invalid_argument("an index needs one index array per indexed dimension");
  }
  if (!std::is_sorted(dims.begin(), dims.end()) || std::adjacent_find(dims.begin(), dims.end()) != dims.end() ||
      dims.front() < 0 || dims.back() >= static_cast<int>(x.ndim())) {
    throw std::invalid_argument("index dimensions must ascend within the indexed array's " +
                                std::to_string(x.ndim()) + " dimensions");
  }
  const int num_dims = dims.back() + 1;
  std::vector<bool> is_array(num_dims, false);
  size_t max_ndim = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    is_array[dims[i]] = true;
    max_ndim = std::max(max_ndim, env.t(refs->Get(i)).ndim());
  }
  const bool first = arrays_first(is_array);
  const int num_slices = num_dims - static_cast<int>(dims.size());
  const int index_ndim = std::max(min_index_ndim, static_cast<int>(max_ndim) + num_slices);

  AdvancedKey key;
  key.num_dims = num_dims;
  int slice_num = 0;
  size_t array_num = 0;
  for (int dim = 0; dim < num_dims; ++dim) {
    mx::Shape shape(index_ndim, 1);
    if (!is_array[dim]) {  // a full slice, spelled out as indices
      auto positions = mx::arange(0, x.shape(dim), 1, mx::uint32);
      shape[slice_num + (first ? static_cast<int>(max_ndim) : 0)] = x.shape(dim);
      key.indices.push_back(mx::reshape(positions, shape));
      ++slice_num;
      continue;
    }
    const auto index = in_bounds(env.t(refs->Get(array_num)), x.shape(dim));
    const int start = (first ? 0 : slice_num) + static_cast<int>(max_ndim) - static_cast<int>(index.ndim());
    for (size_t j = 0; j < index.ndim(); ++j) {
      shape[start + j] = index.shape(j);
    }
    key.indices.push_back(mx::reshape(index, shape));
    if (++array_num == dims.size() && !first) {
      slice_num += static_cast<int>(max_ndim);
    }
  }
  key.indices = mx::broadcast_arrays(key.indices);
  key.index_shape = key.indices.front().shape();
  return key;
}

std::vector<int> leading_axes(int count) {
  std::vector<int> axes(count);
  std::iota(axes.begin(), axes.end(), 0);
  return axes;
}

// The shape of x after its first `count` dimensions.
mx::Shape trailing_shape(const mx::array& x, int count) { return mx::Shape(x.shape().begin() + count, x.shape().end()); }

mx::array index(const etmlx_ir::Index& op, Env& env) {
  const auto& x = env.t(op.x());
  const auto key = advanced_key(op, x, env, 0);
  auto slice_sizes = x.shape();
  std::fill(slice_sizes.begin(), slice_sizes.begin() + key.num_dims, 1);
  const auto gathered = mx::gather(x, key.indices, leading_axes(key.num_dims), slice_sizes);
  auto squeezed = leading_axes(key.num_dims);
  for (auto& axis : squeezed) {
    axis += static_cast<int>(key.index_shape.size());
  }
  return mx::squeeze(gathered, squeezed);
}

mx::array squeeze_leading_ones(const mx::array& x) {
  int count = 0;
  while (count < static_cast<int>(x.ndim()) && x.shape(count) == 1) {
    ++count;
  }
  return mx::squeeze(x, leading_axes(count));
}

using etmlx_ir::ScatterReduce;
using ScatterFn = mx::array (*)(const mx::array&, const std::vector<mx::array>&, const mx::array&,
                                const std::vector<int>&);

// How IndexPut combines values with x when it does not accumulate: `x[key] = values`
// as mlx's Python binding writes it, or `x.at[key].multiply(values)` and the like.
constexpr std::array<std::pair<ScatterReduce, ScatterFn>, 4> kScatter = {{
    {ScatterReduce::None, [](const mx::array& x, const std::vector<mx::array>& indices, const mx::array& values,
                             const std::vector<int>& axes) { return mx::scatter(x, indices, values, axes); }},
    {ScatterReduce::Multiply, [](const mx::array& x, const std::vector<mx::array>& indices, const mx::array& values,
                                 const std::vector<int>& axes) { return mx::scatter_prod(x, indices, values, axes); }},
    {ScatterReduce::Maximum, [](const mx::array& x, const std::vector<mx::array>& indices, const mx::array& values,
                                const std::vector<int>& axes) { return mx::scatter_max(x, indices, values, axes); }},
    {ScatterReduce::Minimum, [](const mx::array& x, const std::vector<mx::array>& indices, const mx::array& values,
                                const std::vector<int>& axes) { return mx::scatter_min(x, indices, values, axes); }},
}};
static_assert(covers_enum(kScatter), "every ScatterReduce needs a handler, in enum order");

mx::array index_put(const etmlx_ir::IndexPut& op, Env& env) {
  if (op.accumulate() && op.reduce() != ScatterReduce::None) {
    throw std::invalid_argument("an IndexPut that both accumulates and reduces");
  }
  const auto& x = env.t(op.x());
  const auto key = advanced_key(op, x, env, 1);
  auto target = key.index_shape;
  const auto rest = trailing_shape(x, key.num_dims);
  target.insert(target.end(), rest.begin(), rest.end());
  auto values = mx::broadcast_to(squeeze_leading_ones(env.t(op.values())), target);
  auto update_shape = key.index_shape;
  update_shape.insert(update_shape.end(), key.num_dims, 1);
  update_shape.insert(update_shape.end(), rest.begin(), rest.end());
  values = mx::reshape(values, update_shape);
  const auto axes = leading_axes(key.num_dims);
  if (op.accumulate()) {
    return mx::scatter_add(x, key.indices, values, axes);
  }
  return kScatter[static_cast<size_t>(op.reduce())].second(x, key.indices, values, axes);
}

// Passes the indices on, and records them with their bound for the host-side
// check (see CheckIndex in schema.fbs).
mx::array check_index(const etmlx_ir::CheckIndex& op, Env& env) {
  const auto& indices = env.t(op.indices());
  if (!mx::issubdtype(indices.dtype(), mx::integer)) {
    throw std::invalid_argument("indices must be integers");
  }
  env.add_index_check(indices, env.size(op.size()));
  return indices;
}

mx::array take(const etmlx_ir::Take& op, Env& env) {
  const auto& x = env.t(op.x());
  return mx::take(x, in_bounds(env.t(op.indices()), axis_size(x, op.axis())), op.axis());
}

mx::array take_along_axis(const etmlx_ir::TakeAlongAxis& op, Env& env) {
  const auto& x = env.t(op.x());
  return mx::take_along_axis(x, in_bounds(env.t(op.indices()), axis_size(x, op.axis())), op.axis());
}

}  // namespace

void register_indexing(Registry& r) {
  r.tensor<etmlx_ir::CheckIndex, check_index>();
  r.tensor<etmlx_ir::Take, take>();
  r.tensor<etmlx_ir::TakeAlongAxis, take_along_axis>();
  r.tensor<etmlx_ir::Index, index>();
  r.tensor<etmlx_ir::IndexPut, index_put>();
}

}  // namespace etmlx::native
