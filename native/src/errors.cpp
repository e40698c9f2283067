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

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out.append({'\\', 'x', kHex[c >> 4], kHex[c & 0xf]});
    }
  }
  return out;
}

}  // namespace etmlx::native
