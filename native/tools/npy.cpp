#include "npy.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string_view>
#include <stdexcept>

namespace etmlx::npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// The text after `'key':` in the header dict (which numpy writes as a Python
// literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }).
std::string_view after_key(std::string_view header, std::string_view key, const std::string& path) {
  std::string quoted(1, '\'');  // appended piecewise: GCC 12 warns falsely on "'" + ...
  quoted.append(key).append("':");
  const auto at = header.find(quoted);
  if (at == std::string_view::npos) {
    fail(path, "header lacks '" + std::string(key) + "'");
  }
  auto rest = header.substr(at + quoted.size());
  return rest.substr(std::min(rest.find_first_not_of(' '), rest.size()));
}

std::string quoted_value(std::string_view text, const std::string& path) {
  const auto end = text.find('\'', 1);
  if (text.empty() || text.front() != '\'' || end == std::string_view::npos) {
    fail(path, "malformed header");
  }
  return std::string(text.substr(1, end - 1));
}

std::vector<int64_t> parse_shape(std::string_view text, const std::string& path) {
  const auto end = text.find(')');
  if (text.empty() || text.front() != '(' || end == std::string_view::npos) {
    fail(path, "malformed shape");
  }
  std::vector<int64_t> shape;
  int64_t dim = -1;
  for (char c : text.substr(1, end - 1)) {
    if (c >= '0' && c <= '9') {
      dim = (dim < 0 ? 0 : dim) * 10 + (c - '0');
      if (dim > std::numeric_limits<int32_t>::max()) {
        fail(path, "dimension too large");
      }
    } else if (c == ',') {
      if (dim < 0) {
        fail(path, "malformed shape");
      }
      shape.push_back(dim);
      dim = -1;
    } else if (c != ' ') {
      fail(path, "malformed shape");
    }
  }
  if (dim >= 0) {
    shape.push_back(dim);
  }
  return shape;
}

}  // namespace

size_t item_size(const std::string& descr) {
  static const std::array<std::pair<const char*, size_t>, 10> kSizes = {{
      {"|b1", 1}, {"|u1", 1}, {"|i1", 1}, {"<i2", 2}, {"<u2", 2},
      {"<f2", 2}, {"<i4", 4}, {"<f4", 4}, {"<i8", 8}, {"<f8", 8},
  }};
  for (const auto& [name, size] : kSizes) {
    if (descr == name) {
      return size;
    }
  }
  return 0;
}

Array read(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    fail(path, "cannot open");
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.size() < kMagicSize + 4 || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0) {
    fail(path, "not a .npy file");
  }
  const uint8_t major = bytes[kMagicSize];
  size_t header_start = kMagicSize + 4;
  size_t header_size = bytes[8] | (bytes[9] << 8);
  if (major >= 2) {
    if (bytes.size() < kMagicSize + 6) {
      fail(path, "truncated header");
    }
    header_size = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (static_cast<size_t>(bytes[11]) << 24);
    header_start = kMagicSize + 6;
  }
  if (header_size > bytes.size() - header_start) {
    fail(path, "truncated header");
  }
  const std::string header(bytes.begin() + header_start, bytes.begin() + header_start + header_size);
  Array array;
  array.descr = quoted_value(after_key(header, "descr", path), path);
  if (after_key(header, "fortran_order", path).starts_with("True")) {
    fail(path, "Fortran-ordered arrays are not supported; save a C-ordered array");
  }
  array.shape = parse_shape(after_key(header, "shape", path), path);
  const size_t size = item_size(array.descr);
  if (size == 0) {
    fail(path, "unsupported dtype '" + array.descr + "'");
  }
  uint64_t expected = size;
  for (int64_t dim : array.shape) {
    if (dim != 0 && expected > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      fail(path, "array too large");
    }
    expected *= static_cast<uint64_t>(dim);
  }
  const size_t data_start = header_start + header_size;
  if (bytes.size() - data_start != expected) {
    fail(path, "holds " + std::to_string(bytes.size() - data_start) + " bytes of data, its shape needs " +
                   std::to_string(expected));
  }
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_start), bytes.end());
  return array;
}

void write(const std::string& path, const Array& array) {
  std::string shape = "(";
  for (int64_t dim : array.shape) {
    shape += std::to_string(dim) + ", ";
  }
  if (array.shape.size() > 1) {
    shape.resize(shape.size() - 2);
  } else if (array.shape.size() == 1) {
    shape.resize(shape.size() - 1);
  }
  shape += ")";
  std::string header = "{'descr': '" + array.descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t unpadded = kMagicSize + 4 + header.size() + 1;
  header += std::string((64 - unpadded % 64) % 64, ' ') + "\n";  // data starts 64-byte aligned
  std::ofstream file(path, std::ios::binary);
  if (!file) {
    fail(path, "cannot write");
  }
  file.write(kMagic, kMagicSize);
  const char version[2] = {1, 0};
  file.write(version, 2);
  const uint16_t size = static_cast<uint16_t>(header.size());
  const char size_bytes[2] = {static_cast<char>(size & 0xFF), static_cast<char>(size >> 8)};
  file.write(size_bytes, 2);
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  file.write(reinterpret_cast<const char*>(array.data.data()), static_cast<std::streamsize>(array.data.size()));
  if (!file) {
    fail(path, "write failed");
  }
}

}  // namespace etmlx::npy
