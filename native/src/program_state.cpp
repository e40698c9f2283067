#include "program_state.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <limits>
#include <utility>

#include <mlx/ops.h>
#include <mlx/transforms.h>

#include "dtypes.h"
#include "errors.h"
#include "tensor_io.h"

namespace etmlx::native {

namespace {

// As the Python runtime writes it: "float32[1, 2, 64, 16] growing along axis 2".
std::string describe(const ConstantId& id, int grow_axis) {
  std::string text = etmlx_ir::EnumNameDType(id.dtype);
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
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

ProgramState::ProgramState() {
  static std::atomic<uint64_t> next{1};
  id_ = next++;
}

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

std::vector<std::string> ProgramState::buffer_names() const {
  std::vector<std::string> names;
  for (const auto& [name, buffer] : buffers_) {
    names.push_back(name);
  }
  return names;
}

const ProgramState::Buffer& ProgramState::declared(const std::string& name) const {
  const auto found = buffers_.find(name);
  if (found == buffers_.end()) {
    throw InputError("this program has no buffer '" + name + "'");
  }
  return found->second;
}

mx::array ProgramState::snapshot(const std::string& name) const {
  auto value = mx::contiguous(declared(name).value);
  mx::eval(value);
  return value;
}

void ProgramState::restore(const std::string& name, etmlx_ir::DType dtype, const std::vector<int64_t>& shape,
                           std::span<const uint8_t> bytes, bool check_only) {
  const auto& buffer = declared(name);
  const auto& want = buffer.declared.shape;
  bool fits = dtype == buffer.declared.dtype && shape.size() == want.size();
  uint64_t count = 1;
  for (size_t i = 0; fits && i < shape.size(); ++i) {
    const bool growing = static_cast<int>(i) == buffer.grow_axis;
    fits = shape[i] == want[i] || (growing && shape[i] >= 0 && shape[i] <= want[i]);
    const auto size = static_cast<uint64_t>(fits ? shape[i] : 0);  // 0 to int32's max: validate() bounded want
    if (size != 0 && count > std::numeric_limits<uint64_t>::max() / size) {
      throw InputError("saved buffer '" + name + "' is too large");
    }
    count *= size;
  }
  if (!fits) {
    throw InputError("saved buffer '" + name + "' is " + describe({"", dtype, shape}, -1) + "; this program's is " +
                     describe(buffer.declared, buffer.grow_axis));
  }
  const auto mlx_type = mlx_dtype(dtype);
  if (bytes.size() != count * mlx_type.size()) {
    throw InputError("saved buffer '" + name + "' has " + std::to_string(bytes.size()) + " bytes; its shape needs " +
                     std::to_string(count * mlx_type.size()));
  }
  if (!check_only) {
    mx::Shape dims(shape.begin(), shape.end());
    buffers_.at(name).value = copy_array(bytes.data(), bytes.size(), std::move(dims), mlx_type);
  }
}

namespace {

std::map<const NamedDataMap*, std::weak_ptr<ProgramState>>& registered_states() {
  static std::map<const NamedDataMap*, std::weak_ptr<ProgramState>> states;
  return states;
}

thread_local uint64_t last_handed_out = 0;

}  // namespace

std::shared_ptr<ProgramState> program_state(const NamedDataMap* named_data) {
  if (named_data == nullptr) {
    return std::make_shared<ProgramState>();
  }
  auto& states = registered_states();
  std::erase_if(states, [](const auto& entry) { return entry.second.expired(); });
  auto& entry = states[named_data];
  auto state = entry.lock();
  if (!state) {
    state = std::make_shared<ProgramState>();
    entry = state;
  }
  last_handed_out = state->id();
  return state;
}

std::shared_ptr<ProgramState> find_program_state(uint64_t id) {
  for (const auto& [named_data, entry] : registered_states()) {
    if (auto state = entry.lock(); state && state->id() == id) {
      return state;
    }
  }
  return nullptr;
}

uint64_t take_last_program_state() { return std::exchange(last_handed_out, 0); }

}  // namespace etmlx::native
