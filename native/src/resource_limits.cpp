#include "resource_limits.h"

#include <cstdlib>
#include <optional>
#include <limits>
#include <stdexcept>
#include <string>

#include "constants.h"
#include "errors.h"

namespace etmlx::native {

namespace {

uint64_t read_limit(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) {
    return fallback;
  }
  const auto value = parse_byte_count(text);
  if (!value) {
    throw std::invalid_argument(std::string(name) + " must be a number of bytes, not '" + text + "'");
  }
  return *value;
}

}  // namespace

std::optional<uint64_t> parse_byte_count(std::string_view text) {
  if (text.empty() || text.size() > 19) {  // 19 digits always fit in 63 bits
    return std::nullopt;
  }
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') {
      return std::nullopt;
    }
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::optional(value) : std::nullopt;
}

uint64_t max_array_bytes() {
  static const uint64_t limit = read_limit("ETMLX_MAX_ARRAY_BYTES", kDefaultMaxArrayBytes);
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
