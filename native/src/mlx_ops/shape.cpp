// Reshape, Transpose, ExpandDims, Squeeze, BroadcastTo, Slice, Concatenate,
// Pad, Tile.
#include <stdexcept>
#include <string>
#include <utility>

#include <mlx/ops.h>

#include "registry.h"
#include "scalars.h"

namespace etmlx::native {

namespace {

int checked_axis(int axis, const mx::array& x) {
  if (axis < 0 || axis >= static_cast<int>(x.ndim())) {
    throw std::invalid_argument("axis " + std::to_string(axis) + " out of range for an array of " +
                                std::to_string(x.ndim()) + " dimensions");
  }
  return axis;
}

// Python's slice(start, stop, step).indices(length): PyTorch clamps slice bounds
// to the dimension (an open end arrives as INT64_MAX), as Python does.
std::array<int64_t, 3> slice_indices(int64_t start, int64_t stop, int64_t step, int64_t length) {
  if (step == 0) {
    throw std::invalid_argument("slice step cannot be zero");
  }
  const int64_t lower = step < 0 ? -1 : 0;
  const int64_t upper = step < 0 ? length - 1 : length;
  auto clamp = [&](int64_t value) {
    if (value < 0) {
      value += length;
      return value < 0 ? lower : value;
    }
    return value >= upper ? upper : value;
  };
  return {clamp(start), clamp(stop), step};
}

mx::array slice(const etmlx_ir::Slice& op, Env& env) {
  const auto& x = env.t(op.x());
  const int axis = checked_axis(op.axis(), x);
  const auto [start, stop, step] = slice_indices(env.size(op.start()), env.size(op.stop()), op.step(), x.shape(axis));
  mx::Shape starts(x.ndim(), 0);
  mx::Shape stops = x.shape();
  mx::Shape strides(x.ndim(), 1);
  starts[axis] = Env::dim(start);
  stops[axis] = Env::dim(stop);
  strides[axis] = Env::dim(step);
  return mx::slice(x, std::move(starts), std::move(stops), std::move(strides));
}

mx::array pad(const etmlx_ir::Pad& op, Env& env) {
  const auto& x = env.t(op.x());
  const auto width = ints(op.pad_width());
  if (width.size() % 2 != 0) {
    throw std::invalid_argument("pad widths come in (before, after) pairs; got " + std::to_string(width.size()));
  }
  std::vector<std::pair<int, int>> pairs;
  for (size_t i = 0; i < width.size(); i += 2) {
    pairs.emplace_back(width[i], width[i + 1]);
  }
  return mx::pad(x, pairs, float_scalar(op.value(), x.dtype()));
}

mx::array reshape(const etmlx_ir::Reshape& op, Env& env) { return mx::reshape(env.t(op.x()), env.shape(op.shape())); }

mx::array transpose(const etmlx_ir::Transpose& op, Env& env) { return mx::transpose(env.t(op.x()), ints(op.perm())); }

mx::array expand_dims(const etmlx_ir::ExpandDims& op, Env& env) {
  return mx::expand_dims(env.t(op.x()), ints(op.axes()));
}

mx::array squeeze(const etmlx_ir::Squeeze& op, Env& env) { return mx::squeeze(env.t(op.x()), ints(op.axes())); }

mx::array broadcast_to(const etmlx_ir::BroadcastTo& op, Env& env) {
  return mx::broadcast_to(env.t(op.x()), env.shape(op.shape()));
}

mx::array concatenate(const etmlx_ir::Concatenate& op, Env& env) {
  std::vector<mx::array> xs;
  if (op.xs() != nullptr) {
    for (flatbuffers::uoffset_t i = 0; i < op.xs()->size(); ++i) {
      xs.push_back(env.t(op.xs()->Get(i)));
    }
  }
  return mx::concatenate(std::move(xs), op.axis());
}

mx::array tile(const etmlx_ir::Tile& op, Env& env) { return mx::tile(env.t(op.x()), ints(op.reps())); }

}  // namespace

void register_shape(Registry& r) {
  r.tensor<etmlx_ir::Reshape, reshape>();
  r.tensor<etmlx_ir::Transpose, transpose>();
  r.tensor<etmlx_ir::ExpandDims, expand_dims>();
  r.tensor<etmlx_ir::Squeeze, squeeze>();
  r.tensor<etmlx_ir::BroadcastTo, broadcast_to>();
  r.tensor<etmlx_ir::Slice, slice>();
  r.tensor<etmlx_ir::Concatenate, concatenate>();
  r.tensor<etmlx_ir::Pad, pad>();
  r.tensor<etmlx_ir::Tile, tile>();
}

}  // namespace etmlx::native
