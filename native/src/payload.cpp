#include "payload.h"

#include <array>
#include <cstring>
#include <string>

#include "errors.h"

namespace etmlx::native {

namespace {

constexpr size_t kHeaderSize = 24;

// The flatbuffer verifier's limits: deep enough and large enough for any graph
// the writer makes, small enough that a hostile file cannot make it spin.
constexpr uint32_t kMaxDepth = 64;
constexpr uint32_t kMaxTables = 16'000'000;

// zlib's CRC-32 (reflected polynomial 0xEDB88320), as Python's zlib.crc32.
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) {
      c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    table[n] = c;
  }
  return table;
}

uint32_t crc32(std::span<const uint8_t> bytes) {
  static constexpr auto kTable = make_crc_table();
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t byte : bytes) {
    crc = kTable[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

template <class T>
T read_le(std::span<const uint8_t> bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));  // the format and every target are little endian
  return value;
}

}  // namespace

Payload read_payload(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderSize) {
    throw FormatError("payload truncated: " + std::to_string(bytes.size()) + " bytes, header needs " +
                      std::to_string(kHeaderSize));
  }
  if (std::memcmp(bytes.data(), kPayloadMagic, sizeof(kPayloadMagic)) != 0) {
    throw FormatError("not an etmlx payload: bad magic");
  }
  const auto version = read_le<uint32_t>(bytes, 4);
  const auto body_size = read_le<uint64_t>(bytes, 8);
  const auto expected_crc = read_le<uint32_t>(bytes, 16);
  if (version > kFormatVersion) {
    throw VersionError("payload format version " + std::to_string(version) + " is newer than this etmlx reads (" +
                       std::to_string(kFormatVersion) + "); upgrade etmlx or re-export the model");
  }
  const auto body = bytes.subspan(kHeaderSize);
  if (body.size() < body_size) {
    throw FormatError("payload truncated: header promises " + std::to_string(body_size) + " bytes, " +
                      std::to_string(body.size()) + " present");
  }
  const auto graph_bytes = body.first(static_cast<size_t>(body_size));
  if (graph_bytes.empty()) {
    throw FormatError("payload empty: the header promises no graph");
  }
  if (crc32(graph_bytes) != expected_crc) {
    throw FormatError("payload corrupted: checksum mismatch");
  }

  Payload payload;
  payload.storage.resize((graph_bytes.size() + sizeof(uint64_t) - 1) / sizeof(uint64_t));
  std::memcpy(payload.storage.data(), graph_bytes.data(), graph_bytes.size());
  const auto* data = reinterpret_cast<const uint8_t*>(payload.storage.data());
  flatbuffers::Verifier::Options options;
  options.max_depth = kMaxDepth;
  options.max_tables = kMaxTables;
  flatbuffers::Verifier verifier(data, graph_bytes.size(), options);
  if (!etmlx_ir::VerifyGraphBuffer(verifier)) {
    throw FormatError("payload unreadable: the graph flatbuffer fails verification");
  }
  payload.graph = etmlx_ir::GetGraph(data);
  payload.layout = validate(*payload.graph);
  return payload;
}

}  // namespace etmlx::native
