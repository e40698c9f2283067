// Limits that keep a small, damaged or hostile payload from making the backend
// allocate without bound (runtime_shim/limits.py holds the Python runtime's,
// from the same environment variables).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <mlx/array.h>

namespace etmlx::native {

// ETMLX_MAX_ARRAY_BYTES (default kDefaultMaxArrayBytes, 16 GiB): the largest
// array one node may make.
uint64_t max_array_bytes();

// A limit's value: decimal digits only, at most 2^63 - 1; nullopt otherwise
// (a sign, spaces, an empty string). runtime_shim/limits.py reads the same.
std::optional<uint64_t> parse_byte_count(std::string_view text);

// Throws FormatError when `array` (not yet evaluated) would be larger than
// max_array_bytes(); computed from its shape, so it holds even where the
// element count overflows.
void check_array_size(const mlx::core::array& array, const char* node);

}  // namespace etmlx::native
