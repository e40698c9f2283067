#include "program_state.h"

#include "errors.h"

namespace etmlx::native {

namespace {

std::string describe(const ConstantId& id) {
  std::string text = etmlx_ir::EnumNameDType(id.dtype);
  text += "[";
  for (size_t i = 0; i < id.shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(id.shape[i]);
  }
  return text + "]";
}

}  // namespace

ConstantId constant_id(const etmlx_ir::NamedTensor& tensor) {
  ConstantId id{tensor.key()->str(), tensor.dtype(), {}};
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

void ProgramState::declare_buffer(const std::string& name, const ConstantId& initial,
                                  const std::function<mx::array()>& load) {
  const auto found = buffers_.find(name);
  if (found == buffers_.end()) {
    buffers_.emplace(name, Buffer{initial, load()});
    return;
  }
  const auto& declared = found->second.declared;
  if (declared.dtype != initial.dtype || declared.shape != initial.shape) {
    throw FormatError("buffer '" + name + "' is declared as " + describe(initial) + " by one delegate and " +
                      describe(declared) + " by another");
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
