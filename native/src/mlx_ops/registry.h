// The op handlers: one per IR node table, registered by family (one file per
// family, as runtime_shim/mlx_ops/ in Python). A handler computes the value of
// its node's `out` (an mx::array) or `out_int` (an integer).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "env.h"

namespace etmlx::native {

using TensorHandler = mx::array (*)(const void* table, Env& env);
using IntHandler = int64_t (*)(const void* table, Env& env);

struct Handler {
  TensorHandler tensor = nullptr;
  IntHandler integer = nullptr;
};

template <class Table>
using TensorFn = mx::array (*)(const Table&, Env&);
template <class Table>
using IntFn = int64_t (*)(const Table&, Env&);

class Registry {
 public:
  template <class Table, TensorFn<Table> F>
  void tensor() {
    add(etmlx_ir::OpTraits<Table>::enum_value,
        Handler{[](const void* table, Env& env) { return F(*static_cast<const Table*>(table), env); }, nullptr});
  }

  template <class Table, IntFn<Table> F>
  void integer() {
    add(etmlx_ir::OpTraits<Table>::enum_value,
        Handler{nullptr, [](const void* table, Env& env) { return F(*static_cast<const Table*>(table), env); }});
  }

  // Names the operations of a family table ("Unary.Neg", ...), for the coverage
  // test that compares the two runtimes.
  void operations(const std::string& table, const std::vector<std::string>& names);

  const Handler* find(etmlx_ir::Op op) const;
  const std::vector<std::string>& operation_names() const { return names_; }

 private:
  void add(etmlx_ir::Op op, Handler handler);

  std::array<Handler, static_cast<size_t>(etmlx_ir::Op::MAX) + 1> handlers_{};
  std::vector<std::string> names_;
};

// Every family's handlers, registered once.
const Registry& registry();

// One per family file.
void register_attention(Registry& registry);
void register_collectives(Registry& registry);
void register_convolution(Registry& registry);
void register_creation(Registry& registry);
void register_elementwise(Registry& registry);
void register_indexing(Registry& registry);
void register_matmul(Registry& registry);
void register_normalization(Registry& registry);
void register_quantized(Registry& registry);
void register_reduction(Registry& registry);
void register_scan(Registry& registry);
void register_shape(Registry& registry);
void register_sizes(Registry& registry);
void register_state_space(Registry& registry);

// A family's op enum -> function table, in enum order, complete: checked at
// compile time by each family with `covers_enum`.
template <class Enum, class Fn, size_t N>
constexpr bool covers_enum(const std::array<std::pair<Enum, Fn>, N>& table) {
  if (N != static_cast<size_t>(Enum::MAX) + 1) {
    return false;
  }
  for (size_t i = 0; i < N; ++i) {
    if (static_cast<size_t>(table[i].first) != i) {
      return false;
    }
  }
  return true;
}

// The names of a family table's operations, for Registry::operations.
template <class Enum, class Fn, size_t N>
std::vector<std::string> enum_names(const std::array<std::pair<Enum, Fn>, N>& table, const char* (*name)(Enum)) {
  std::vector<std::string> names;
  for (const auto& entry : table) {
    names.emplace_back(name(entry.first));
  }
  return names;
}

}  // namespace etmlx::native
