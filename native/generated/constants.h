// Generated from serializer/constants.py by serializer/regenerate.py. Do not edit.
// What the exporter and both runtimes agree on (see serializer/constants.py).
#pragma once

#include <array>
#include <cstdint>

namespace etmlx::native {

inline constexpr const char* kBackendId = "EtMlxBackend";
inline constexpr char kPayloadMagic[4] = {'E', 'M', 'L', 'X'};
inline constexpr uint32_t kFormatVersion = 11;
inline constexpr uint32_t kMaxSlots = 16777216;
inline constexpr uint64_t kDefaultMaxArrayBytes = 17179869184;
inline constexpr std::array<int, 6> kQuantizedBits = {2, 3, 4, 5, 6, 8};
inline constexpr std::array<int, 3> kQuantizedGroupSizes = {32, 64, 128};
inline constexpr std::array<int, 3> kQuantizedFloatBits = {4, 8, 4};
inline constexpr std::array<int, 3> kQuantizedFloatGroupSizes = {32, 32, 16};
inline constexpr std::array<int, 2> kQuantizedCacheBits = {4, 8};

// The last error's kind, through the C interface (c_api.cpp).
enum class ErrorKind : int { None = 0, Format = 1, Version = 2, Input = 3, IndexRange = 4, Memory = 5, Other = 6 };

}  // namespace etmlx::native
