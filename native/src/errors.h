// Errors the native backend raises internally; the backend turns each into an
// ExecuTorch Error code and a logged reason at its boundary (backend.cpp).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "constants.h"

namespace etmlx::native {

// The payload, or the program data it names, is malformed: init answers
// InvalidProgram.
class FormatError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A payload written by a newer etmlx: init answers DelegateInvalidCompatibility.
class VersionError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The arguments of a call do not match the delegate: execute answers
// InvalidArgument.
class InputError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A run-time index is out of range (a CheckIndex failed): execute answers
// InvalidArgument, and etmlx.native raises IndexError, as PyTorch would.
class IndexRangeError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the last error the backend returned on this thread was, for callers
// (etmlx.native) that want more than the ExecuTorch error code; its kind is an
// ErrorKind (constants.h, from serializer/constants.py).

struct LastError {
  ErrorKind kind = ErrorKind::None;
  std::string detail;   // what went wrong
  std::string message;  // the logged line: backend, method and detail
};

void set_last_error(LastError error);

// `text` with every byte outside printable ASCII written as \xNN: messages quote
// strings from the payload (keys, names), which a damaged file can make invalid
// UTF-8, and ExecuTorch's Python bindings turn log lines into Python strings.
std::string printable(std::string_view text);
const LastError& last_error();

}  // namespace etmlx::native
