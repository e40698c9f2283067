// One loaded etmlx delegate: an interpreter of the IR that builds one lazy MLX
// graph per call, evaluated at the delegate's boundary, as the Python runtime's
// MlxDelegate (runtime_shim/mlx_delegate.py) does.
//
// The interpreter is a pure function of (inputs, buffer values), so it runs
// under mlx::core::compile: traced once per input shapes, then replayed with no
// work per node. ETMLX_COMPILE=0 turns that off, as in Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <mlx/array.h>
#include <map>
#include <mlx/compile_impl.h>

#include "index_checks.h"
#include "mlx_ops/registry.h"
#include "payload.h"
#include "program_state.h"

namespace etmlx::native {

// A delegate argument or result: a tensor, or a size (a SymInt).
using Value = std::variant<mx::array, int64_t>;

class Delegate {
 public:
  Delegate(Payload payload, const NamedDataMap* named_data, std::shared_ptr<ProgramState> state);
  ~Delegate();
  Delegate(const Delegate&) = delete;
  Delegate& operator=(const Delegate&) = delete;

  // The call's results, not yet evaluated: evaluate all of them together,
  // `verify` the index checks, then `commit` the updates. A call that fails
  // before `commit` leaves the buffers as they were.
  struct Results {
    std::vector<Value> outputs;
    std::vector<mx::array> buffer_updates;
    std::vector<mx::array> checked_indices;  // per CheckIndex, in run order
    std::vector<mx::array> checked_sizes;    // int64 scalars, per CheckIndex whose size is not static
  };
  Results compute(const std::vector<Value>& inputs);
  // Throws IndexRangeError for the first CheckIndex whose evaluated indices are
  // out of range.
  void verify(const Results& results) const;
  void commit(std::vector<mx::array> buffer_updates);

  size_t num_inputs() const { return input_kinds_.size(); }
  size_t num_outputs() const { return output_kinds_.size(); }

 private:
  struct Step {
    const Handler* handler;
    const void* table;
    uint32_t out;
    bool is_int;
    etmlx_ir::Op type;
  };
  Results interpret(const std::vector<Value>& inputs, const std::vector<mx::array>& buffers,
                    const std::vector<mx::array>& literals) const;
  std::vector<mx::array> interpret_arrays(const std::vector<int64_t>& sizes, const std::vector<mx::array>& arrays) const;
  // The compiled graph for this call, made on the second call of its signature (the
  // integer inputs' values, the arrays' shapes and dtypes): a prompt's length is one
  // call's shape, compiling it would only cost its trace (a 1B model's 37-token prefill:
  // 4.1 s compiled, 3.4 s interpreted, 20 MiB held for the program's life), a decode
  // step's is every step's. Null on a signature's first call or when the graph cannot
  // be compiled.
  const std::function<std::vector<mx::array>(const std::vector<mx::array>&)>* compiled(
      const std::vector<int64_t>& sizes, const std::vector<mx::array>& arrays);
  void hoist_constant_steps(const GraphLayout& layout);
  void separate_literals();

  Payload payload_;
  const etmlx_ir::Graph& graph_;
  std::shared_ptr<ProgramState> state_;
  std::vector<Step> steps_;
  std::vector<std::pair<uint32_t, mx::array>> constants_;
  std::vector<bool> transposed_matrices_;  // per slot: a hoisted 2-D constant's transposed view (Env)
  // Size-1 constants, passed to the compiled graph as arguments rather than captured:
  // mlx::core::compile writes a captured one into the code it generates as a literal,
  // and drops the sign of -0.0 (mlx 0.32).
  std::vector<uint32_t> literal_slots_;
  std::vector<mx::array> literals_;
  std::vector<IndexCheck> index_checks_;  // per CheckIndex step, in the order they run
  size_t num_checked_sizes_ = 0;          // how many of them have no static size
  std::vector<std::pair<std::string, uint32_t>> buffer_slots_;    // buffer name, slot it is read from
  std::vector<std::pair<std::string, uint32_t>> buffer_updates_;  // buffer name, slot of its new value
  std::vector<std::pair<std::string, size_t>> growing_;  // growing buffer's name, the input giving its extent
  std::vector<etmlx_ir::ValueKind> input_kinds_;
  std::vector<etmlx_ir::ValueKind> output_kinds_;

  // One compiled graph per call signature, the least recently used dropped past
  // kMaxCompiledGraphs. A size read on the host (an attention window's) is invisible to
  // a trace, so it is a constant of the graph compiled for it. mlx::core::compile keeps
  // one trace cache per thread, keyed by an id; ids are never reused, and a graph's
  // traces are erased from every cache this delegate traced into when it is dropped.
  struct Compiled {
    std::function<std::vector<mx::array>(const std::vector<mx::array>&)> function;
    uintptr_t id;
    uint64_t last_call;
  };
  void erase_traces(uintptr_t id);
  static constexpr size_t kMaxCompiledGraphs = 16;    // runtime_shim: MAX_COMPILED_GRAPHS
  static constexpr size_t kMaxSignaturesSeen = 1024;  // signatures called once, remembered
  bool compilable_ = false;
  uint64_t calls_ = 0;
  std::map<std::vector<int64_t>, Compiled> compiled_;
  std::set<std::vector<int64_t>> seen_;
  std::vector<mx::detail::CompileCacheWeakPtr> compile_caches_;
};

}  // namespace etmlx::native
