#include "errors.h"

namespace etmlx::native {

namespace {

std::string& last_error_storage() {
  thread_local std::string message;
  return message;
}

}  // namespace

void set_last_error(std::string message) { last_error_storage() = std::move(message); }

const std::string& last_error() { return last_error_storage(); }

}  // namespace etmlx::native
