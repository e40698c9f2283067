#include "registry.h"

#include <stdexcept>

namespace etmlx::native {

void Registry::add(etmlx_ir::Op op, Handler handler) {
  auto& slot = handlers_.at(static_cast<size_t>(op));
  if (slot.tensor != nullptr || slot.integer != nullptr) {
    throw std::logic_error(std::string("two handlers for ") + etmlx_ir::EnumNameOp(op));
  }
  slot = handler;
  names_.emplace_back(etmlx_ir::EnumNameOp(op));
}

void Registry::operations(const std::string& table, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    names_.push_back(table + "." + name);
  }
}

const Handler* Registry::find(etmlx_ir::Op op) const {
  const auto index = static_cast<size_t>(op);
  if (index >= handlers_.size()) {
    return nullptr;
  }
  const auto& handler = handlers_[index];
  return handler.tensor == nullptr && handler.integer == nullptr ? nullptr : &handler;
}

const Registry& registry() {
  static const Registry instance = [] {
    Registry r;
    register_attention(r);
    register_collectives(r);
    register_convolution(r);
    register_creation(r);
    register_elementwise(r);
    register_indexing(r);
    register_matmul(r);
    register_normalization(r);
    register_quantized(r);
    register_reduction(r);
    register_scan(r);
    register_shape(r);
    register_sizes(r);
    register_state_space(r);
    return r;
  }();
  return instance;
}

}  // namespace etmlx::native
