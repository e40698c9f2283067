// Generated from serializer/constants.py by serializer/regenerate.py. Do not edit.
// What the exporter and both runtimes agree on (see serializer/constants.py).
#pragma once

#include <array>
#include <cstdint>

namespace etmlx::native {

inline constexpr const char* kBackendId = "EtMlxBackend";
inline constexpr char kPayloadMagic[4] = {'E', 'M', 'L', 'X'};
inline constexpr uint32_t kFormatVersion = 13;
inline constexpr uint32_t kMaxSlots = 16777216;
inline constexpr uint64_t kDefaultMaxArrayBytes = 17179869184;
inline constexpr std::array<int, 6> kQuantizedBits = {2, 3, 4, 5, 6, 8};
inline constexpr std::array<int, 3> kQuantizedGroupSizes = {32, 64, 128};
inline constexpr std::array<int, 3> kQuantizedFloatBits = {4, 8, 4};
inline constexpr std::array<int, 3> kQuantizedFloatGroupSizes = {32, 32, 16};
inline constexpr std::array<int, 2> kQuantizedCacheBits = {4, 8};
inline constexpr double kErfClamp = 3.92;
inline constexpr double kExpLow = -87.33654475;
inline constexpr double kExpHigh = 88.72283906;
inline constexpr double kLn2High = 0.693145751953125;
inline constexpr double kLn2Low = 1.428606765330187e-06;
inline constexpr double kExpNonpositiveLeast = -104.0;
inline constexpr double kRoundToInteger = 12582912.0;
inline constexpr double kGatedDeltaLeastLog = -200.0;
inline constexpr int kExpNonpositiveLift = 25;
inline constexpr int kGatedDeltaChunk = 64;
inline constexpr std::array<double, 7> kErfNumerator = {1.1283791679566195, 0.1852445021439774, 0.05427724677815554, 0.0038456590528055438, 0.0003776770556171965, 4.630621975650062e-06, -1.2917060060457786e-08};
inline constexpr std::array<double, 6> kErfDenominator = {1.0, 0.49750205580674356, 0.11393555123000897, 0.015447125406539381, 0.0013042144079156112, 6.260447516659353e-05};

// The last error's kind, through the C interface (c_api.cpp).
enum class ErrorKind : int { None = 0, Format = 1, Version = 2, Input = 3, IndexRange = 4, Memory = 5, Other = 6 };

}  // namespace etmlx::native
