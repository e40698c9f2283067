// A small C interface for etmlx.native (Python, through ctypes): the reason
// behind the last error, and the operations this runtime implements.
#include <string>

#include "errors.h"
#include "mlx_ops/registry.h"
#include "payload.h"

namespace etmlx::native {
bool backend_registered();
}

extern "C" {

__attribute__((visibility("default"))) const char* etmlx_native_last_error() {
  return etmlx::native::last_error().c_str();
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

__attribute__((visibility("default"))) int etmlx_native_registered() {
  return etmlx::native::backend_registered() ? 1 : 0;
}

}  // extern "C"
