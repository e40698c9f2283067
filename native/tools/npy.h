// NumPy's .npy format (version 1-3, C order, little endian), read and written:
// the input and output files of etmlx_run. bfloat16 travels as its 16-bit
// pattern ('<u2'), as numpy has no bfloat16.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace etmlx::npy {

struct Array {
  std::string descr;           // '<f4', '|b1', ...
  std::vector<int64_t> shape;  // empty for a 0-d array
  std::vector<uint8_t> data;   // C order
};

// Throws std::runtime_error naming what is wrong with the file.
Array read(const std::string& path);
void write(const std::string& path, const Array& array);

// The element size a descr names, or 0 for a descr this reader does not know.
size_t item_size(const std::string& descr);

}  // namespace etmlx::npy
