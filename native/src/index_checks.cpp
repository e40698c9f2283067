#include "index_checks.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "errors.h"

namespace etmlx::native {

namespace {

// The first element of `indices` (row-major order) outside [low, size), if any,
// in decimal. std::cmp_* compare the values exactly, whatever their type.
template <class T>
std::optional<std::string> first_outside(const mx::array& indices, int64_t low, int64_t size) {
  const T* data = indices.data<T>();
  const auto& shape = indices.shape();
  const auto& strides = indices.strides();
  std::vector<int64_t> position(shape.size(), 0);
  int64_t offset = 0;
  for (size_t n = 0; n < indices.size(); ++n) {
    const T value = data[offset];
    if (std::cmp_less(value, low) || std::cmp_greater_equal(value, size)) {
      return std::to_string(value);
    }
    for (size_t axis = shape.size(); axis-- > 0;) {  // the next position, last axis fastest
      offset += strides[axis];
      if (++position[axis] < shape[axis]) {
        break;
      }
      offset -= strides[axis] * position[axis];
      position[axis] = 0;
    }
  }
  return std::nullopt;
}

std::optional<std::string> first_out_of_range(const mx::array& indices, int64_t low, int64_t size) {
  switch (indices.dtype().val()) {
    case mx::Dtype::Val::int8: return first_outside<int8_t>(indices, low, size);
    case mx::Dtype::Val::int16: return first_outside<int16_t>(indices, low, size);
    case mx::Dtype::Val::int32: return first_outside<int32_t>(indices, low, size);
    case mx::Dtype::Val::int64: return first_outside<int64_t>(indices, low, size);
    case mx::Dtype::Val::uint8: return first_outside<uint8_t>(indices, low, size);
    case mx::Dtype::Val::uint16: return first_outside<uint16_t>(indices, low, size);
    case mx::Dtype::Val::uint32: return first_outside<uint32_t>(indices, low, size);
    case mx::Dtype::Val::uint64: return first_outside<uint64_t>(indices, low, size);
    default: throw std::invalid_argument("indices must be integers");
  }
}

}  // namespace

IndexCheck::IndexCheck(const etmlx_ir::CheckIndex& op)
    : what_(op.what() ? op.what()->str() : "an index"), wraps_(op.wraps()) {
  if (op.size() != nullptr && !op.size()->is_slot()) {
    if (op.size()->value() < 0) {
      throw FormatError("a CheckIndex against a negative size, " + std::to_string(op.size()->value()));
    }
    static_size_ = op.size()->value();
  }
}

void IndexCheck::verify(const mx::array& indices, int64_t size) const {
  const int64_t low = wraps_ ? -size : 0;
  if (const auto first = first_out_of_range(indices, low, size)) {
    const auto valid = size == 0 ? std::string("none") : std::to_string(low) + " to " + std::to_string(size - 1);
    throw IndexRangeError(what_ + " holds index " + *first + ", out of range for a dimension of size " +
                          std::to_string(size) + " (valid: " + valid + ")");
  }
}

}  // namespace etmlx::native
