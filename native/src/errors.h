// Errors the native backend raises internally; the backend turns each into an
// ExecuTorch Error code and a logged reason at its boundary (backend.cpp).
#pragma once

#include <stdexcept>
#include <string>

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

// The message of the last error the backend returned on this thread, for
// callers (etmlx.native) that want the reason and not only the error code.
void set_last_error(std::string message);
const std::string& last_error();

}  // namespace etmlx::native
