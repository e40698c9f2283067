// State that lives as long as a loaded program and is shared by all its
// delegates: constants (so a prefill and a decode method hold one copy of the
// weights) and mutable buffers by name (so the KV cache a prefill method fills
// is the one a decode method reads). Mirrors runtime_shim/state.py.
#pragma once

#include <compare>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <executorch/runtime/core/named_data_map.h>
#include <mlx/array.h>

#include "etmlx_ir_generated.h"

namespace etmlx::native {

namespace mx = mlx::core;
using NamedDataMap = executorch::runtime::NamedDataMap;

// Keys hash the bytes only (all-zero tensors of different dtypes share one),
// so an array is identified by key, dtype and shape.
struct ConstantId {
  std::string key;
  etmlx_ir::DType dtype;
  std::vector<int64_t> shape;
  auto operator<=>(const ConstantId&) const = default;
};

ConstantId constant_id(const etmlx_ir::NamedTensor& tensor);

class ProgramState {
 public:
  ProgramState();

  // Unique in the process, never reused: how the C interface names this state.
  uint64_t id() const { return id_; }

  // The array for `id`, made by `load()` the first time it is asked for.
  mx::array constant(const ConstantId& id, const std::function<mx::array()>& load);

  // Declares buffer `name`; the first delegate to declare it sets its initial
  // value: `load()`, or for a buffer that grows along `grow_axis` (>= 0) an empty
  // extent there. Throws FormatError when two delegates declare it differently.
  void declare_buffer(const std::string& name, const ConstantId& initial, int grow_axis,
                      const std::function<mx::array()>& load);

  // Extends growing buffer `name` with zeros to `extent` along its axis (a copy of
  // the part held, once per window a conversation grows into). Throws InputError
  // for an extent past its declared shape.
  void reserve(const std::string& name, int64_t extent);

  const mx::array& buffer(const std::string& name) const { return buffers_.at(name).value; }
  void set_buffer(const std::string& name, mx::array value) { buffers_.at(name).value = std::move(value); }

  // For saved KV caches (etmlx.prompt_cache, through c_api.cpp): the buffers' names,
  // one buffer evaluated and contiguous (a growing one as far as it is held), and a
  // buffer set to a copy of `bytes` -- which must have its declared dtype and shape,
  // a growing one at most its capacity along its axis, else InputError.
  std::vector<std::string> buffer_names() const;
  mx::array snapshot(const std::string& name) const;
  void restore(const std::string& name, etmlx_ir::DType dtype, const std::vector<int64_t>& shape,
               std::span<const uint8_t> bytes, bool check_only);

 private:
  struct Buffer {
    ConstantId declared;
    int grow_axis;  // -1: held whole from the start
    mx::array value;
  };
  const Buffer& declared(const std::string& name) const;  // InputError if there is none

  uint64_t id_;
  std::map<ConstantId, mx::array> constants_;
  std::map<std::string, Buffer> buffers_;
};

// The state of the program whose named data is `named_data`: ExecuTorch hands
// every method of one loaded program the same map, and two loads different
// ones. Without named data a delegate has no constants or buffers to share and
// gets a state of its own. The caller holds the backend's lock.
std::shared_ptr<ProgramState> program_state(const NamedDataMap* named_data);

// The state with this id, or null when its program is gone.
std::shared_ptr<ProgramState> find_program_state(uint64_t id);

// The id of the state `program_state` last handed out on this thread (the program
// whose delegates were initialized last), then 0 until it hands out another.
uint64_t take_last_program_state();

}  // namespace etmlx::native
