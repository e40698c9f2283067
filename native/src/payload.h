// The etmlx delegate payload: a 24-byte header, then a Graph flatbuffer
// (serializer/payload.py writes it; this reads it the same way).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "constants.h"  // kFormatVersion: the newest payload this reads; a newer one is a VersionError
#include "etmlx_ir_generated.h"
#include "validate.h"

namespace etmlx::native {

// A verified payload: the Graph lives in `storage`, an 8-byte-aligned copy of
// the flatbuffer, so the delegate no longer needs ExecuTorch's buffer.
struct Payload {
  std::vector<uint64_t> storage;
  const etmlx_ir::Graph* graph = nullptr;
  GraphLayout layout;  // what each node reads and writes, from validate()
};

// Checks the header (magic, version, size, CRC32), verifies the flatbuffer and
// validates the graph; throws FormatError or VersionError naming the problem.
Payload read_payload(std::span<const uint8_t> bytes);

}  // namespace etmlx::native
