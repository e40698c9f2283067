#include "delegate.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <mlx/ops.h>
#include <mlx/transforms.h>

#include "dtypes.h"
#include "errors.h"
#include "resource_limits.h"
#include "tensor_io.h"

namespace etmlx::native {

namespace {

bool compile_enabled() {
  const char* flag = std::getenv("ETMLX_COMPILE");
  return flag == nullptr || std::strcmp(flag, "0") != 0;
}

uintptr_t next_compile_id() {
  static std::atomic<uintptr_t> next{1};
  return next++;
}

template <class T>
std::vector<const T*> items(const flatbuffers::Vector<flatbuffers::Offset<T>>* vector) {
  std::vector<const T*> out;
  if (vector != nullptr) {
    for (flatbuffers::uoffset_t i = 0; i < vector->size(); ++i) {
      out.push_back(vector->Get(i));
    }
  }
  return out;
}

// An MLX array of a NamedTensor's bytes in the program's named data. Where the
// allocator can (Metal), MLX uses the bytes in place; elsewhere it copies them.
mx::array load_named(const etmlx_ir::NamedTensor& tensor, const NamedDataMap* named_data) {
  const std::string key = tensor.key()->str();
  if (named_data == nullptr) {
    throw FormatError("constant '" + key + "': the program has no named data");
  }
  auto found = named_data->get_data(key);
  if (!found.ok()) {
    throw FormatError("constant '" + key + "' is not in the program's named data");
  }
  const auto dtype = mlx_dtype(tensor.dtype());
  mx::Shape shape;
  uint64_t expected = dtype.size();
  if (tensor.shape() != nullptr) {
    for (int64_t size : *tensor.shape()) {  // validate() bounded each size to int32
      shape.push_back(static_cast<int>(size));
      if (size != 0 && expected > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(size)) {
        throw FormatError("constant '" + key + "' is too large");
      }
      expected *= static_cast<uint64_t>(size);
    }
  }
  auto buffer = std::make_shared<executorch::runtime::FreeableBuffer>(std::move(found.get()));
  if (buffer->size() != expected) {
    throw FormatError("constant '" + key + "' has " + std::to_string(buffer->size()) + " bytes, its shape and dtype need " +
                      std::to_string(expected));
  }
  auto data = buffer->data_safe();
  if (!data.ok()) {
    throw FormatError("constant '" + key + "' is not addressable");
  }
  auto* bytes = const_cast<void*>(data.get());
  if (expected == 0 || reinterpret_cast<uintptr_t>(bytes) % dtype.size() != 0) {
    return copy_array(bytes, expected, shape, dtype);  // so MLX never reads a misaligned element
  }
  return mx::array(bytes, shape, dtype, [buffer](void*) {});
}

}  // namespace

Delegate::Delegate(Payload payload, const NamedDataMap* named_data, std::shared_ptr<ProgramState> state)
    : payload_(std::move(payload)), graph_(*payload_.graph), state_(std::move(state)) {
  for (const auto* value : items(graph_.inputs())) {
    input_kinds_.push_back(value->kind());
  }
  for (const auto* value : items(graph_.outputs())) {
    output_kinds_.push_back(value->kind());
  }
  for (const auto* constant : items(graph_.constants())) {
    const auto array = state_->constant(constant_id(*constant), [&] { return load_named(*constant, named_data); });
    constants_.emplace_back(constant->slot(), array);
  }
  for (const auto* buffer : items(graph_.buffers())) {
    const auto& initial = *buffer->initial();
    const std::string name = buffer->name()->str();
    state_->declare_buffer(name, constant_id(initial), buffer->grow_axis(),
                           [&] { return load_named(initial, named_data); });
    if (buffer->grow_axis() >= 0) {  // validate() checked its extent is an integer input's slot
      const auto inputs = items(graph_.inputs());
      const auto extent = std::find_if(inputs.begin(), inputs.end(), [&](const auto* value) {
        return value->kind() == etmlx_ir::ValueKind::Int && value->slot() == buffer->grow_extent();
      });
      growing_.emplace_back(name, static_cast<size_t>(extent - inputs.begin()));
    }
    buffer_slots_.emplace_back(name, initial.slot());
    if (buffer->has_update()) {
      buffer_updates_.emplace_back(name, buffer->update());
    }
  }
  const auto& nodes = payload_.layout.nodes;
  const auto graph_nodes = items(graph_.nodes());
  for (size_t i = 0; i < graph_nodes.size(); ++i) {
    const auto* node = graph_nodes[i];
    const Handler* handler = registry().find(node->op_type());
    const std::string where = "node " + std::to_string(i) + " (" + etmlx_ir::EnumNameOp(node->op_type()) + ")";
    if (handler == nullptr) {
      throw FormatError(where + ": no handler in this runtime");
    }
    if ((handler->integer != nullptr) != nodes[i].out_is_int) {
      throw FormatError(where + ": writes the wrong kind of slot");
    }
    steps_.push_back({handler, node->op(), nodes[i].out, nodes[i].out_is_int, node->op_type()});
  }
  hoist_constant_steps(payload_.layout);
  separate_literals();
  for (const auto& step : steps_) {
    if (step.type == etmlx_ir::Op::CheckIndex) {
      index_checks_.emplace_back(*static_cast<const etmlx_ir::CheckIndex*>(step.table));
      num_checked_sizes_ += index_checks_.back().static_size() ? 0 : 1;
    }
  }

  // An integer output is no array, so such graphs are interpreted (as in Python).
  compilable_ = compile_enabled() && std::none_of(output_kinds_.begin(), output_kinds_.end(),
                                                  [](auto k) { return k == etmlx_ir::ValueKind::Int; });
}

Delegate::~Delegate() {
  for (const auto& [signature, compiled] : compiled_) {
    erase_traces(compiled.id);
  }
}

void Delegate::erase_traces(uintptr_t id) {
  for (const auto& cache : compile_caches_) {
    mx::detail::compile_erase(cache, id);
  }
}

const std::function<std::vector<mx::array>(const std::vector<mx::array>&)>* Delegate::compiled(
    const std::vector<int64_t>& sizes, const std::vector<mx::array>& arrays) {
  if (!compilable_) {
    return nullptr;
  }
  std::vector<int64_t> signature = sizes;
  for (const auto& array : arrays) {
    signature.push_back(static_cast<int64_t>(array.dtype().val()));
    signature.push_back(array.ndim());
    signature.insert(signature.end(), array.shape().begin(), array.shape().end());
  }
  auto found = compiled_.find(signature);
  if (found == compiled_.end()) {
    if (seen_.insert(signature).second) {  // its first call: interpreted
      if (seen_.size() > kMaxSignaturesSeen) {
        seen_ = {signature};
      }
      return nullptr;
    }
    seen_.erase(signature);
    if (compiled_.size() >= kMaxCompiledGraphs) {
      const auto oldest = std::min_element(compiled_.begin(), compiled_.end(), [](const auto& a, const auto& b) {
        return a.second.last_call < b.second.last_call;
      });
      erase_traces(oldest->second.id);
      compiled_.erase(oldest);
    }
    const auto id = next_compile_id();
    auto function = mx::detail::compile(
        [this, sizes](const std::vector<mx::array>& arrays) { return interpret_arrays(sizes, arrays); }, id);
    found = compiled_.emplace(std::move(signature), Compiled{std::move(function), id, 0}).first;
  }
  found->second.last_call = ++calls_;
  return &found->second.function;
}

void Delegate::separate_literals() {
  std::vector<std::pair<uint32_t, mx::array>> constants;
  for (auto& [slot, array] : constants_) {
    if (array.size() == 1) {
      literal_slots_.push_back(slot);
      literals_.push_back(std::move(array));
    } else {
      constants.emplace_back(slot, std::move(array));
    }
  }
  constants_ = std::move(constants);
}

// Evaluates, once at load, every node that reads only constants (scalars,
// fills, ops on weights), adding its result to the constants, and marks those
// results that are a 2-D matrix's transposed view.
void Delegate::hoist_constant_steps(const GraphLayout& layout) {
  Env env(graph_.num_tensor_slots(), 0);
  transposed_matrices_.assign(graph_.num_tensor_slots(), false);
  std::vector<bool> is_constant(graph_.num_tensor_slots(), false);
  for (const auto& [slot, array] : constants_) {
    env.set(slot, array);
    is_constant[slot] = true;
  }
  std::vector<Step> remaining;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto& step = steps_[i];
    const auto& slots = layout.nodes[i];
    const bool reads_constants_only =
        !slots.out_is_int && !slots.reads_ints && step.type != etmlx_ir::Op::CheckIndex &&  // its indices are checked on every call
        std::all_of(slots.tensor_reads.begin(), slots.tensor_reads.end(), [&](uint32_t s) { return is_constant[s]; });
    if (!reads_constants_only) {
      remaining.push_back(step);
      continue;
    }
    auto value = step.handler->tensor(step.table, env);
    mx::eval(value);
    if (step.type == etmlx_ir::Op::Transpose && value.ndim() == 2) {
      const auto* perm = static_cast<const etmlx_ir::Transpose*>(step.table)->perm();
      transposed_matrices_[step.out] = perm != nullptr && perm->size() == 2 && perm->Get(0) == 1 && perm->Get(1) == 0;
    }
    env.set(step.out, value);
    is_constant[step.out] = true;
    constants_.emplace_back(step.out, std::move(value));
  }
  steps_ = std::move(remaining);
}

Delegate::Results Delegate::interpret(const std::vector<Value>& inputs, const std::vector<mx::array>& buffers,
                                      const std::vector<mx::array>& literals) const {
  Env env(graph_.num_tensor_slots(), graph_.num_int_slots(), &transposed_matrices_);
  const auto graph_inputs = items(graph_.inputs());
  for (size_t i = 0; i < graph_inputs.size(); ++i) {
    if (graph_inputs[i]->kind() == etmlx_ir::ValueKind::Int) {
      env.set_int(graph_inputs[i]->slot(), std::get<int64_t>(inputs[i]));
    } else {
      env.set(graph_inputs[i]->slot(), std::get<mx::array>(inputs[i]));
    }
  }
  for (const auto& [slot, array] : constants_) {
    env.set(slot, array);
  }
  for (size_t i = 0; i < literal_slots_.size(); ++i) {
    env.set(literal_slots_[i], literals.at(i));
  }
  for (size_t i = 0; i < buffer_slots_.size(); ++i) {
    env.set(buffer_slots_[i].second, buffers[i]);
  }
  for (const auto& step : steps_) {
    if (step.is_int) {
      env.set_int(step.out, step.handler->integer(step.table, env));
    } else {
      auto value = step.handler->tensor(step.table, env);
      check_array_size(value, etmlx_ir::EnumNameOp(step.type));
      env.set(step.out, std::move(value));
    }
  }
  Results results;
  for (const auto* value : items(graph_.outputs())) {
    if (value->kind() == etmlx_ir::ValueKind::Int) {
      results.outputs.emplace_back(env.int_at(value->slot()));
    } else {
      results.outputs.emplace_back(env.tensor(value->slot()));
    }
  }
  for (const auto& [name, slot] : buffer_updates_) {
    results.buffer_updates.push_back(env.tensor(slot));
  }
  const auto& checked = env.index_checks();
  if (checked.size() != index_checks_.size()) {
    throw std::logic_error("index checks of an unexpected count");
  }
  for (size_t i = 0; i < checked.size(); ++i) {
    results.checked_indices.push_back(checked[i].indices);
    if (!index_checks_[i].static_size()) {
      results.checked_sizes.push_back(mx::array(checked[i].size, mx::int64));
    }
  }
  return results;
}

// The graph as a function of arrays alone, for mlx::core::compile: tensor inputs,
// buffer values and literals in (the integer inputs fixed to `sizes`); outputs, buffer
// updates and index checks out.
std::vector<mx::array> Delegate::interpret_arrays(const std::vector<int64_t>& sizes,
                                                  const std::vector<mx::array>& arrays) const {
  std::vector<Value> inputs;
  auto array = arrays.begin();
  auto size = sizes.begin();
  for (const auto kind : input_kinds_) {
    if (kind == etmlx_ir::ValueKind::Int) {
      inputs.emplace_back(*size++);
    } else {
      inputs.emplace_back(*array++);
    }
  }
  const auto buffers_start = array;
  const auto literals_start = buffers_start + static_cast<std::ptrdiff_t>(buffer_slots_.size());
  const std::vector<mx::array> buffers(buffers_start, literals_start);
  const std::vector<mx::array> literals(literals_start, arrays.end());
  auto results = interpret(inputs, buffers, literals);
  std::vector<mx::array> flat;
  for (auto& output : results.outputs) {
    flat.push_back(std::get<mx::array>(output));
  }
  flat.insert(flat.end(), results.buffer_updates.begin(), results.buffer_updates.end());
  flat.insert(flat.end(), results.checked_indices.begin(), results.checked_indices.end());
  flat.insert(flat.end(), results.checked_sizes.begin(), results.checked_sizes.end());
  return flat;
}

Delegate::Results Delegate::compute(const std::vector<Value>& inputs) {
  if (inputs.size() != num_inputs()) {
    throw InputError("the delegate takes " + std::to_string(num_inputs()) + " inputs, the call passes " +
                     std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (std::holds_alternative<int64_t>(inputs[i]) != (input_kinds_[i] == etmlx_ir::ValueKind::Int)) {
      throw InputError("input " + std::to_string(i) + " should be " +
                       (input_kinds_[i] == etmlx_ir::ValueKind::Int ? "an integer" : "a tensor"));
    }
  }
  for (const auto& [name, input] : growing_) {
    state_->reserve(name, std::get<int64_t>(inputs[input]));
  }
  std::vector<mx::array> buffers;
  for (const auto& [name, slot] : buffer_slots_) {
    buffers.push_back(state_->buffer(name));
  }
  std::vector<int64_t> sizes;
  std::vector<mx::array> arrays;
  for (const auto& input : inputs) {
    if (std::holds_alternative<int64_t>(input)) {
      sizes.push_back(std::get<int64_t>(input));
    } else {
      arrays.push_back(std::get<mx::array>(input));
    }
  }
  arrays.insert(arrays.end(), buffers.begin(), buffers.end());
  const auto* function = compiled(sizes, arrays);
  if (function == nullptr) {
    return interpret(inputs, buffers, literals_);
  }
  arrays.insert(arrays.end(), literals_.begin(), literals_.end());
  auto flat = (*function)(arrays);
  auto cache = mx::detail::compile_cache();
  const bool known = std::any_of(compile_caches_.begin(), compile_caches_.end(), [&](const auto& seen) {
    return !seen.owner_before(cache) && !cache.owner_before(seen);
  });
  if (!known) {
    compile_caches_.push_back(cache);
  }
  if (flat.size() != num_outputs() + buffer_updates_.size() + index_checks_.size() + num_checked_sizes_) {
    throw std::logic_error("a compiled graph with an unexpected count of results");
  }
  Results results;
  auto next = flat.begin();
  const auto take = [&next](std::vector<mx::array>& into, size_t count) {
    into.assign(next, next + static_cast<std::ptrdiff_t>(count));
    next += static_cast<std::ptrdiff_t>(count);
  };
  results.outputs.assign(next, next + static_cast<std::ptrdiff_t>(num_outputs()));
  next += static_cast<std::ptrdiff_t>(num_outputs());
  take(results.buffer_updates, buffer_updates_.size());
  take(results.checked_indices, index_checks_.size());
  take(results.checked_sizes, num_checked_sizes_);
  return results;
}

void Delegate::verify(const Results& results) const {
  auto size = results.checked_sizes.begin();
  for (size_t i = 0; i < index_checks_.size(); ++i) {
    const auto& check = index_checks_[i];
    check.verify(results.checked_indices.at(i), check.static_size() ? *check.static_size() : (size++)->item<int64_t>());
  }
}

void Delegate::commit(std::vector<mx::array> buffer_updates) {
  for (size_t i = 0; i < buffer_updates_.size(); ++i) {
    state_->set_buffer(buffer_updates_[i].first, std::move(buffer_updates[i]));
  }
}

}  // namespace etmlx::native
