#include "resource_limits.h"

#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "errors.h"

namespace etmlx::native {

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

uint64_t read_limit(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) {
    return fallback;
  }
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-') {  // as runtime_shim/limits.py refuses it
    throw std::invalid_argument(std::string(name) + " must be a number of bytes, not '" + text + "'");
  }
  return value;
}

}  // namespace

uint64_t max_array_bytes() {
  static const uint64_t limit = read_limit("ETMLX_MAX_ARRAY_BYTES", 16 * kGiB);
  return limit;
}

void check_array_size(const mlx::core::array& array, const char* node) {
  const uint64_t limit = max_array_bytes();
  uint64_t bytes = array.itemsize();
  bool past = false;
  for (const auto dim : array.shape()) {
    if (dim < 0) {
      throw FormatError(std::string("a ") + node + " node makes an array with a negative dimension");
    }
    past = past || (dim != 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim));
    bytes = past ? bytes : bytes * static_cast<uint64_t>(dim);
    if (dim == 0) {
      return;  // empty, whatever the other dimensions
    }
  }
  if (past || bytes > limit) {
    throw FormatError(std::string("a ") + node + " node makes an array past the limit of " + std::to_string(limit) +
                      " bytes (ETMLX_MAX_ARRAY_BYTES)");
  }
}

}  // namespace etmlx::native
