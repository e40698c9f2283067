#include "validate.h"

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>

#include <flatbuffers/minireflect.h>

#include "constants.h"
#include "errors.h"

namespace etmlx::native {

namespace {

using flatbuffers::TypeTable;

class Slots {
 public:
  Slots(const char* kind, uint32_t count) : kind_(kind), written_(count, false) {}

  void write(uint64_t idx, const std::string& where) {
    check_range(idx, where);
    if (written_[idx]) {
      throw FormatError(where + ": " + kind_ + " slot " + std::to_string(idx) + " written twice");
    }
    written_[idx] = true;
  }

  void read(uint64_t idx, const std::string& where) const {
    check_range(idx, where);
    if (!written_[idx]) {
      throw FormatError(where + ": reads " + kind_ + " slot " + std::to_string(idx) + " before it is written");
    }
  }

 private:
  void check_range(uint64_t idx, const std::string& where) const {
    if (idx >= written_.size()) {
      throw FormatError(where + ": " + kind_ + " slot " + std::to_string(idx) + " out of range (graph has " +
                        std::to_string(written_.size()) + ")");
    }
  }

  std::string kind_;
  std::vector<bool> written_;
};

flatbuffers::voffset_t field_offset(size_t field) {
  return flatbuffers::FieldIndexToOffset(static_cast<flatbuffers::voffset_t>(field));
}

const TypeTable* field_type(const TypeTable& table, size_t field) {
  const auto ref = table.type_codes[field].sequence_ref;
  return ref < 0 ? nullptr : table.type_refs[ref]();
}

int64_t scalar_field(const flatbuffers::Table& table, size_t field, flatbuffers::ElementaryType type) {
  const auto offset = field_offset(field);
  switch (type) {
    case flatbuffers::ET_BOOL:
    case flatbuffers::ET_UCHAR:
      return table.GetField<uint8_t>(offset, 0);
    case flatbuffers::ET_CHAR:
      return table.GetField<int8_t>(offset, 0);
    case flatbuffers::ET_SHORT:
      return table.GetField<int16_t>(offset, 0);
    case flatbuffers::ET_USHORT:
      return table.GetField<uint16_t>(offset, 0);
    case flatbuffers::ET_INT:
      return table.GetField<int32_t>(offset, 0);
    case flatbuffers::ET_UINT:
      return table.GetField<uint32_t>(offset, 0);
    default:
      return table.GetField<int64_t>(offset, 0);
  }
}

bool is_enum_member(const TypeTable& enum_table, int64_t value) {
  if (enum_table.values == nullptr) {  // members 0 .. n-1
    return value >= 0 && value < static_cast<int64_t>(enum_table.num_elems);
  }
  for (size_t i = 0; i < enum_table.num_elems; ++i) {
    if (enum_table.values[i] == value) {
      return true;
    }
  }
  return false;
}

// False when the table has a `has_<name>` flag that is false.
bool operand_present(const flatbuffers::Table& table, const TypeTable& type, std::string_view name) {
  const std::string flag = "has_" + std::string(name);
  for (size_t i = 0; i < type.num_elems; ++i) {
    if (flag == type.names[i]) {
      return table.GetField<uint8_t>(field_offset(i), 0) != 0;
    }
  }
  return true;
}

class NodeChecker {
 public:
  NodeChecker(Slots& tensors, Slots& ints) : tensors_(tensors), ints_(ints) {}

  NodeSlots check(const flatbuffers::Table& table, const TypeTable& type, const std::string& where) {
    NodeSlots slots;
    bool writes = false;
    for (size_t field = 0; field < type.num_elems; ++field) {
      const std::string_view name = type.names[field];
      const std::string at = where + " " + std::string(name);
      const auto code = type.type_codes[field];
      const TypeTable* ref = field_type(type, field);
      const bool written = name == "out" || name == "out_int";
      if (ref == etmlx_ir::TidTypeTable()) {
        if (code.is_repeating) {
          for (const auto* tid : vector_of<etmlx_ir::Tid>(table, field, at)) {
            read_tensor(tid->idx(), at, slots);
          }
          continue;
        }
        const auto* tid = table.GetStruct<const etmlx_ir::Tid*>(field_offset(field));
        if (written) {
          if (tid == nullptr) {
            throw FormatError(where + ": missing result slot");
          }
          tensors_.write(tid->idx(), where);
          slots.out = tid->idx();
          writes = true;
        } else if (operand_present(table, type, name)) {
          if (tid == nullptr) {
            throw FormatError(at + ": missing operand");
          }
          read_tensor(tid->idx(), at, slots);
        }
      } else if (ref == etmlx_ir::IntOrSlotTypeTable()) {
        if (code.is_repeating) {
          for (const auto* size : vector_of<etmlx_ir::IntOrSlot>(table, field, at)) {
            read_size(*size, at, slots);
          }
          continue;
        }
        const auto* size = table.GetStruct<const etmlx_ir::IntOrSlot*>(field_offset(field));
        if (size == nullptr) {
          throw FormatError(written ? where + ": missing result slot" : at + ": missing size");
        }
        if (written) {
          if (!size->is_slot() || size->value() < 0) {
            throw FormatError(where + ": missing result slot");
          }
          ints_.write(static_cast<uint64_t>(size->value()), where);
          slots.out = static_cast<uint32_t>(size->value());
          slots.out_is_int = true;
          writes = true;
        } else {
          read_size(*size, at, slots);
        }
      } else if (ref != nullptr && ref->st == flatbuffers::ST_ENUM && !code.is_repeating) {
        const auto value = scalar_field(table, field, static_cast<flatbuffers::ElementaryType>(code.base_type));
        if (!is_enum_member(*ref, value)) {
          throw FormatError(at + ": unknown value " + std::to_string(value));
        }
      }
    }
    if (!writes) {
      throw FormatError(where + ": writes no slot");
    }
    return slots;
  }

 private:
  // The structs of a vector field (none when the field is absent). The verifier
  // checks a vector's bounds but aligns only its length, and an IntOrSlot needs 8.
  template <class T>
  static std::vector<const T*> vector_of(const flatbuffers::Table& table, size_t field, const std::string& where) {
    std::vector<const T*> items;
    if (const auto* vector = table.GetPointer<const flatbuffers::Vector<const T*>*>(field_offset(field))) {
      if (reinterpret_cast<uintptr_t>(vector->Data()) % alignof(T) != 0) {
        throw FormatError(where + ": misaligned vector");
      }
      for (flatbuffers::uoffset_t i = 0; i < vector->size(); ++i) {
        items.push_back(vector->Get(i));
      }
    }
    return items;
  }

  void read_tensor(uint32_t idx, const std::string& where, NodeSlots& slots) {
    tensors_.read(idx, where);
    slots.tensor_reads.push_back(idx);
  }

  void read_size(const etmlx_ir::IntOrSlot& size, const std::string& where, NodeSlots& slots) {
    if (!size.is_slot()) {
      return;
    }
    if (size.value() < 0) {
      throw FormatError(where + ": int slot " + std::to_string(size.value()) + " out of range");
    }
    ints_.read(static_cast<uint64_t>(size.value()), where);
    slots.reads_ints = true;
  }

  Slots& tensors_;
  Slots& ints_;
};

void check_named_tensor(const etmlx_ir::NamedTensor* tensor, Slots& tensors, const std::string& where,
                        bool stored = true) {
  if (tensor == nullptr) {
    throw FormatError(where + ": missing");
  }
  if (stored && (tensor->key() == nullptr || tensor->key()->size() == 0)) {
    throw FormatError(where + ": missing data key");
  }
  if (tensor->dtype() < etmlx_ir::DType::MIN || tensor->dtype() > etmlx_ir::DType::MAX) {
    throw FormatError(where + ": unknown dtype " + std::to_string(static_cast<int>(tensor->dtype())));
  }
  if (tensor->shape() != nullptr) {
    for (int64_t size : *tensor->shape()) {
      if (size < 0 || size > std::numeric_limits<int32_t>::max()) {
        throw FormatError(where + ": size " + std::to_string(size) + " out of range");
      }
    }
  }
  tensors.write(tensor->slot(), where);
}

// A growing buffer's axis lies in its shape, its extent is an integer input, and
// it names no stored data (it starts as zeros).
void check_growth(const etmlx_ir::MutableBuffer& buffer, const etmlx_ir::Graph& graph, const std::string& where) {
  if (buffer.grow_axis() < 0) {
    return;
  }
  const auto* shape = buffer.initial()->shape();
  const int64_t rank = shape == nullptr ? 0 : shape->size();
  if (buffer.grow_axis() >= rank) {
    throw FormatError(where + ": grows along axis " + std::to_string(buffer.grow_axis()) + " of a rank-" +
                      std::to_string(rank) + " shape");
  }
  const auto* inputs = graph.inputs();
  const bool is_input = inputs != nullptr && std::any_of(inputs->begin(), inputs->end(), [&](const auto* value) {
    return value->kind() == etmlx_ir::ValueKind::Int && value->slot() == buffer.grow_extent();
  });
  if (!is_input) {
    throw FormatError(where + ": grows to int slot " + std::to_string(buffer.grow_extent()) +
                      ", which is no integer input");
  }
  if (buffer.initial()->key() != nullptr && buffer.initial()->key()->size() != 0) {
    throw FormatError(where + ": a growing buffer starts as zeros, but names stored data");
  }
}

Slots& slots_of(etmlx_ir::ValueKind kind, Slots& tensors, Slots& ints, const std::string& where) {
  switch (kind) {
    case etmlx_ir::ValueKind::Tensor:
      return tensors;
    case etmlx_ir::ValueKind::Int:
      return ints;
  }
  throw FormatError(where + ": unknown value kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace

GraphLayout validate(const etmlx_ir::Graph& graph) {
  for (const auto& [kind, count] : {std::pair{"tensor", graph.num_tensor_slots()}, {"int", graph.num_int_slots()}}) {
    if (count > kMaxSlots) {  // refused before anything is allocated for them
      throw FormatError("graph declares " + std::to_string(count) + " " + kind + " slots; at most " +
                        std::to_string(kMaxSlots));
    }
  }
  Slots tensors("tensor", graph.num_tensor_slots());
  Slots ints("int", graph.num_int_slots());
  if (graph.inputs() != nullptr) {
    for (uint32_t i = 0; i < graph.inputs()->size(); ++i) {
      const auto* value = graph.inputs()->Get(i);
      const std::string where = "input " + std::to_string(i);
      slots_of(value->kind(), tensors, ints, where).write(value->slot(), where);
    }
  }
  if (graph.constants() != nullptr) {
    for (uint32_t i = 0; i < graph.constants()->size(); ++i) {
      check_named_tensor(graph.constants()->Get(i), tensors, "constant " + std::to_string(i));
    }
  }
  if (graph.buffers() != nullptr) {
    for (uint32_t i = 0; i < graph.buffers()->size(); ++i) {
      const auto* buffer = graph.buffers()->Get(i);
      const std::string where = "buffer " + std::to_string(i);
      if (buffer->initial() == nullptr || buffer->name() == nullptr || buffer->name()->size() == 0) {
        throw FormatError(where + ": missing initial value or name");
      }
      check_growth(*buffer, graph, where);
      check_named_tensor(buffer->initial(), tensors, where, buffer->grow_axis() < 0);
    }
  }
  GraphLayout layout;
  NodeChecker checker(tensors, ints);
  if (graph.nodes() != nullptr) {
    layout.nodes.reserve(graph.nodes()->size());
    for (uint32_t i = 0; i < graph.nodes()->size(); ++i) {
      const auto* node = graph.nodes()->Get(i);
      const auto type = static_cast<size_t>(node->op_type());
      std::string where = "node " + std::to_string(i);
      if (type == 0 || type > static_cast<size_t>(etmlx_ir::Op::MAX) || node->op() == nullptr) {
        throw FormatError(where + ": unknown node type " + std::to_string(type));
      }
      where += " (" + std::string(etmlx_ir::EnumNameOp(node->op_type())) + ")";
      const TypeTable* table_type = field_type(*etmlx_ir::OpTypeTable(), type);
      const auto* table = static_cast<const flatbuffers::Table*>(node->op());
      layout.nodes.push_back(checker.check(*table, *table_type, where));
    }
  }
  if (graph.buffers() != nullptr) {
    for (uint32_t i = 0; i < graph.buffers()->size(); ++i) {
      const auto* buffer = graph.buffers()->Get(i);
      if (buffer->has_update()) {
        tensors.read(buffer->update(), "buffer " + std::to_string(i) + " update");
      }
    }
  }
  if (graph.outputs() != nullptr) {
    for (uint32_t i = 0; i < graph.outputs()->size(); ++i) {
      const auto* value = graph.outputs()->Get(i);
      const std::string where = "output " + std::to_string(i);
      slots_of(value->kind(), tensors, ints, where).read(value->slot(), where);
    }
  }
  return layout;
}

}  // namespace etmlx::native
