// Structural checks of a verified Graph: every slot index in range, every enum
// known, every slot written exactly once and before it is read.
//
// The checks read each node table through its flatbuffers mini-reflection
// table, by the schema's conventions (serializer/schema.fbs): a Tid or
// IntOrSlot named `out`/`out_int` is written, any other is read; an operand
// `x` is absent when the table's `has_x` is false; every enum field must hold
// a member of its enum. So a new node table needs no code here, as in
// serializer/validate.py.
#pragma once

#include <cstdint>
#include <vector>

#include "etmlx_ir_generated.h"

namespace etmlx::native {

// What one node reads and writes.
struct NodeSlots {
  uint32_t out = 0;  // the slot the node writes
  bool out_is_int = false;
  std::vector<uint32_t> tensor_reads;
  bool reads_ints = false;
};

struct GraphLayout {
  std::vector<NodeSlots> nodes;  // in node order
};

// Throws FormatError naming the first problem found.
GraphLayout validate(const etmlx_ir::Graph& graph);

}  // namespace etmlx::native
