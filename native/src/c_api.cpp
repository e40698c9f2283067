// A small C interface for etmlx.native (Python, through ctypes): the reason
// behind the last error, and the operations this runtime implements.
#include <cstdint>
#include <string>

#include "errors.h"
#include "mlx_ops/registry.h"
#include "payload.h"
#include "resource_limits.h"

namespace etmlx::native {
bool backend_registered();
}

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

}  // extern "C"
