// The values of one delegate call: tensor slots and int slots, read by the op
// handlers. The reader has checked every slot a node names is in range and
// written before it is read.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mlx/array.h>

#include "etmlx_ir_generated.h"

namespace etmlx::native {

namespace mx = mlx::core;

class Env {
 public:
  // transposed_matrices: per slot, whether it holds a constant 2-D matrix's transposed
  // view, made once at load (a linear layer's weight, stored as the checkpoint holds it):
  // matmul.cpp reads the matrix as stored where that is faster. Null: none does.
  Env(uint32_t num_tensors, uint32_t num_ints, const std::vector<bool>* transposed_matrices = nullptr)
      : tensors_(num_tensors), ints_(num_ints, 0), transposed_matrices_(transposed_matrices) {}

  const mx::array& t(const etmlx_ir::Tid* ref) const { return tensor(ref->idx()); }
  const mx::array& tensor(uint32_t slot) const { return *tensors_[slot]; }
  // An operand the node may leave out (a mask, a weight, biases): its array where present.
  std::optional<mx::array> t_if(bool present, const etmlx_ir::Tid* ref) const {
    return present ? std::optional<mx::array>(t(ref)) : std::nullopt;
  }
  bool transposed_matrix(const etmlx_ir::Tid* ref) const {
    return transposed_matrices_ != nullptr && (*transposed_matrices_)[ref->idx()];
  }
  void set(uint32_t slot, mx::array value) { tensors_[slot] = std::move(value); }

  int64_t size(const etmlx_ir::IntOrSlot* ref) const {
    return ref->is_slot() ? ints_[static_cast<size_t>(ref->value())] : ref->value();
  }
  int64_t int_at(uint32_t slot) const { return ints_[slot]; }
  void set_int(uint32_t slot, int64_t value) { ints_[slot] = value; }

  // Sizes as an MLX shape; MLX dimensions are 32-bit.
  mx::Shape shape(const flatbuffers::Vector<const etmlx_ir::IntOrSlot*>* refs) const {
    mx::Shape shape;
    if (refs != nullptr) {
      for (flatbuffers::uoffset_t i = 0; i < refs->size(); ++i) {
        shape.push_back(dim(size(refs->Get(i))));
      }
    }
    return shape;
  }

  // Per CheckIndex run, in node order: its indices and the size of the axis
  // they index, checked on the host once the call is evaluated (index_checks.h).
  struct CheckedIndices {
    mx::array indices;
    int64_t size;
  };
  void add_index_check(mx::array indices, int64_t size) { index_checks_.push_back({std::move(indices), size}); }
  const std::vector<CheckedIndices>& index_checks() const { return index_checks_; }

  // What make() returns, made once per call for `key`: values several nodes derive
  // alike from the same slots (the angles of Rope nodes at the same positions).
  template <typename Make>
  const std::vector<mx::array>& shared(const std::vector<int64_t>& key, Make make) {
    auto found = shared_.find(key);
    if (found == shared_.end()) {
      found = shared_.emplace(key, make()).first;
    }
    return found->second;
  }

  static int32_t dim(int64_t value) {
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument("size " + std::to_string(value) + " does not fit MLX's 32-bit dimensions");
    }
    return static_cast<int32_t>(value);
  }

 private:
  std::vector<std::optional<mx::array>> tensors_;
  std::vector<int64_t> ints_;
  const std::vector<bool>* transposed_matrices_;
  std::vector<CheckedIndices> index_checks_;
  std::map<std::vector<int64_t>, std::vector<mx::array>> shared_;
};

// A vector of int fields as std::vector<int> (MLX's axes and sizes).
inline std::vector<int> ints(const flatbuffers::Vector<int32_t>* values) {
  return values == nullptr ? std::vector<int>{} : std::vector<int>(values->begin(), values->end());
}

// The operand of a node PyTorch computes on floating-point tensors only (averages,
// variance, log-softmax), whose result is cast back to the operand's dtype. An
// integer operand comes only from a malformed payload, and the cast of its float
// result (inf, NaN) would be undefined behaviour in the code mx.compile generates.
inline const mx::array& floating_operand(const mx::array& x, const std::string& what) {
  if (!mx::issubdtype(x.dtype(), mx::floating)) {
    throw std::invalid_argument(what + " of a tensor that is not floating-point");
  }
  return x;
}

}  // namespace etmlx::native
