#include "errors.h"

namespace etmlx::native {

namespace {

LastError& last_error_storage() {
  thread_local LastError error;
  return error;
}

}  // namespace

void set_last_error(LastError error) { last_error_storage() = std::move(error); }

const LastError& last_error() { return last_error_storage(); }

}  // namespace etmlx::native
