// A small C interface for etmlx.native (Python, through ctypes): the reason
// behind the last error, the operations this runtime implements, and the
// program state a saved KV cache is read from and written into.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtypes.h"
#include "errors.h"
#include "mlx_lock.h"
#include "mlx_ops/registry.h"
#include "payload.h"
#include "program_state.h"
#include "resource_limits.h"

namespace etmlx::native {
bool backend_registered();

namespace {

constexpr int kMaxStateRank = 16;  // the shape arrays of etmlx_native_state_read

// Runs `body` on state `id` under the MLX lock; 1, or 0 with the last error set.
template <class Body>
int with_state(uint64_t id, Body&& body) {
  std::lock_guard lock(mlx_mutex());
  try {
    auto state = find_program_state(id);
    if (!state) {
      throw InputError("the program this state belonged to is gone");
    }
    body(*state);
    set_last_error({});
    return 1;
  } catch (const InputError& e) {
    set_last_error({ErrorKind::Input, printable(e.what()), printable(e.what())});
  } catch (const std::exception& e) {
    set_last_error({ErrorKind::Other, printable(e.what()), printable(e.what())});
  }
  return 0;
}

}  // namespace
}  // namespace etmlx::native

extern "C" {

// The logged line of the last error on this thread ("" if none).
__attribute__((visibility("default"))) const char* etmlx_native_last_error() {
  return etmlx::native::last_error().message.c_str();
}

// What went wrong, without the backend and method.
__attribute__((visibility("default"))) const char* etmlx_native_last_error_detail() {
  return etmlx::native::last_error().detail.c_str();
}

// etmlx::native::ErrorKind of the last error.
__attribute__((visibility("default"))) int etmlx_native_last_error_kind() {
  return static_cast<int>(etmlx::native::last_error().kind);
}

__attribute__((visibility("default"))) void etmlx_native_clear_last_error() { etmlx::native::set_last_error({}); }

// One name per line: each node table, and each operation of a family table
// ("Unary.Neg").
__attribute__((visibility("default"))) const char* etmlx_native_operations() {
  static const std::string names = [] {
    std::string text;
    for (const auto& name : etmlx::native::registry().operation_names()) {
      text += name + "\n";
    }
    return text;
  }();
  return names.c_str();
}

__attribute__((visibility("default"))) int etmlx_native_format_version() {
  return static_cast<int>(etmlx::native::kFormatVersion);
}

// 1 and the value in `value` when `text` is a valid ETMLX_MAX_* limit, else 0
// (tests check that both runtimes read limits alike).
__attribute__((visibility("default"))) int etmlx_native_parse_byte_count(const char* text, uint64_t* value) {
  const auto parsed = etmlx::native::parse_byte_count(text);
  if (parsed) {
    *value = *parsed;
  }
  return parsed ? 1 : 0;
}

__attribute__((visibility("default"))) int etmlx_native_registered() {
  return etmlx::native::backend_registered() ? 1 : 0;
}

// The id of the program state that the delegates initialized last on this thread
// share (etmlx.native reads it right after loading a program), then 0.
__attribute__((visibility("default"))) uint64_t etmlx_native_take_last_state() {
  return etmlx::native::take_last_program_state();
}

// The names of state `state`'s buffers, one per line, in `names` (valid until the
// next call on this thread). 1, or 0 with the last error set.
__attribute__((visibility("default"))) int etmlx_native_state_names(uint64_t state, const char** names) {
  static thread_local std::string text;
  return etmlx::native::with_state(state, [&](etmlx::native::ProgramState& program) {
    text.clear();
    for (const auto& name : program.buffer_names()) {
      text += name + "\n";
    }
    *names = text.c_str();
  });
}

// Buffer `name` of state `state`, evaluated: its etmlx_ir::DType, rank and shape
// (`shape` has room for 16 sizes), and its bytes (valid until the next call on this
// thread). 1, or 0 with the last error set.
__attribute__((visibility("default"))) int etmlx_native_state_read(uint64_t state, const char* name, int* dtype,
                                                                   int* rank, int64_t* shape, const void** data,
                                                                   uint64_t* nbytes) {
  static thread_local std::optional<mlx::core::array> held;
  return etmlx::native::with_state(state, [&](etmlx::native::ProgramState& program) {
    auto value = program.snapshot(name);
    if (value.ndim() > etmlx::native::kMaxStateRank) {
      throw etmlx::native::InputError("buffer '" + std::string(name) + "' has more than 16 dimensions");
    }
    const auto type = etmlx::native::ir_dtype(value.dtype());
    if (!type) {
      throw std::logic_error("a buffer of a dtype the IR lacks");
    }
    *dtype = static_cast<int>(*type);
    *rank = static_cast<int>(value.ndim());
    for (size_t i = 0; i < value.ndim(); ++i) {
      shape[i] = value.shape(static_cast<int>(i));
    }
    *nbytes = value.nbytes();
    held = std::move(value);
    *data = held->data<uint8_t>();
  });
}

// Sets buffer `name` of state `state` to a copy of `nbytes` at `data`, laid out as
// `dtype` (an etmlx_ir::DType) and `shape`; with `check_only`, only checks that it
// fits. 1, or 0 with the last error set (an InputError naming what does not fit).
__attribute__((visibility("default"))) int etmlx_native_state_write(uint64_t state, const char* name, int dtype,
                                                                    int rank, const int64_t* shape, const void* data,
                                                                    uint64_t nbytes, int check_only) {
  return etmlx::native::with_state(state, [&](etmlx::native::ProgramState& program) {
    if (rank < 0 || rank > etmlx::native::kMaxStateRank || dtype < static_cast<int>(etmlx_ir::DType::MIN) ||
        dtype > static_cast<int>(etmlx_ir::DType::MAX)) {
      throw etmlx::native::InputError("saved buffer '" + std::string(name) + "': rank or dtype out of range");
    }
    const std::vector<int64_t> dims(shape, shape + rank);
    program.restore(name, static_cast<etmlx_ir::DType>(dtype), dims,
                    std::span(static_cast<const uint8_t*>(data), static_cast<size_t>(nbytes)), check_only != 0);
  });
}

}  // extern "C"
