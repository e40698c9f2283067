#include "program_state.h"

#include <mlx/ops.h>

#include "dtypes.h"
#include "errors.h"

namespace etmlx::native {

namespace {

std::string describe(const ConstantId& id, int grow_axis) {
  std::string text = etmlx_ir::EnumNameDType(id.dtype);
  text += "[";
  for (size_t i = 0; i < id.shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(id.shape[i]);
  }
  text += "]";
  return grow_axis < 0 ? text : text + " growing along axis " + std::to_string(grow_axis);
}

// The declared shape with nothing held along `axis`.
mx::Shape empty_along(const std::vector<int64_t>& shape, int axis) {
  mx::Shape empty;
  for (size_t i = 0; i < shape.size(); ++i) {
    empty.push_back(static_cast<int>(i) == axis ? 0 : static_cast<int>(shape[i]));  // validate() bounded sizes to int32
  }
  return empty;
}

}  // namespace

ConstantId constant_id(const etmlx_ir::NamedTensor& tensor) {
  ConstantId id{tensor.key() == nullptr ? "" : tensor.key()->str(), tensor.dtype(), {}};  // a growing buffer's has none
  if (tensor.shape() != nullptr) {
    id.shape.assign(tensor.shape()->begin(), tensor.shape()->end());
  }
  return id;
}

mx::array ProgramState::constant(const ConstantId& id, const std::function<mx::array()>& load) {
  auto found = constants_.find(id);
  if (found == constants_.end()) {
    found = constants_.emplace(id, load()).first;
  }
  return found->second;
}

void ProgramState::declare_buffer(const std::string& name, const ConstantId& initial, int grow_axis,
                                  const std::function<mx::array()>& load) {
  const auto found = buffers_.find(name);
  if (found == buffers_.end()) {
    auto value = grow_axis < 0 ? load() : mx::zeros(empty_along(initial.shape, grow_axis), mlx_dtype(initial.dtype));
    buffers_.emplace(name, Buffer{initial, grow_axis, std::move(value)});
    return;
  }
  const auto& declared = found->second;
  if (declared.declared.dtype != initial.dtype || declared.declared.shape != initial.shape ||
      declared.grow_axis != grow_axis) {
    throw FormatError("buffer '" + name + "' is declared as " + describe(initial, grow_axis) + " by one delegate and " +
                      describe(declared.declared, declared.grow_axis) + " by another");
  }
}

void ProgramState::reserve(const std::string& name, int64_t extent) {
  auto& buffer = buffers_.at(name);
  const int axis = buffer.grow_axis;
  const int64_t capacity = buffer.declared.shape.at(static_cast<size_t>(axis));
  if (extent < 0 || extent > capacity) {
    throw InputError("buffer '" + name + "' asked to hold " + std::to_string(extent) + " slots along axis " +
                     std::to_string(axis) + "; it has " + std::to_string(capacity));
  }
  const int held = buffer.value.shape(axis);
  if (held < extent) {
    auto pad = buffer.value.shape();
    pad[static_cast<size_t>(axis)] = static_cast<int>(extent) - held;
    buffer.value = mx::concatenate({buffer.value, mx::zeros(pad, buffer.value.dtype())}, axis);
  }
}

std::shared_ptr<ProgramState> program_state(const NamedDataMap* named_data) {
  static std::map<const NamedDataMap*, std::weak_ptr<ProgramState>> states;
  if (named_data == nullptr) {
    return std::make_shared<ProgramState>();
  }
  std::erase_if(states, [](const auto& entry) { return entry.second.expired(); });
  auto& entry = states[named_data];
  auto state = entry.lock();
  if (!state) {
    state = std::make_shared<ProgramState>();
    entry = state;
  }
  return state;
}

}  // namespace etmlx::native
