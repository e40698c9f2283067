// etmlx_run: runs a method of a .pte with ExecuTorch's Module API and etmlx's
// native backend — the path an app takes, with no Python in the process.
//
//   etmlx_run MODEL.pte [--method NAME] [--output-dir DIR] [--repeat N] [INPUT.npy ...]
//
// Inputs are .npy files, one per method input, in order (bfloat16 as '<u2'
// bit patterns). Each tensor output is written to DIR/output_<i>.npy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include "npy.h"

extern "C" int etmlx_native_registered();
extern "C" const char* etmlx_native_last_error();

namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::Module;

struct Options {
  std::string model;
  std::string method = "forward";
  std::string output_dir = ".";
  int repeat = 1;
  std::vector<std::string> inputs;
};

constexpr const char* kUsage =
    "usage: etmlx_run MODEL.pte [--method NAME] [--output-dir DIR] [--repeat N] [INPUT.npy ...]\n";

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        throw std::runtime_error(arg + " needs a value");
      }
      return argv[++i];
    };
    if (arg == "--method") {
      options.method = value();
    } else if (arg == "--output-dir") {
      options.output_dir = value();
    } else if (arg == "--repeat") {
      const std::string text = value();
      char* end = nullptr;
      const long repeat = std::strtol(text.c_str(), &end, 10);
      if (end == text.c_str() || *end != '\0' || repeat < 1 || repeat > 1'000'000) {
        throw std::runtime_error("--repeat takes a count from 1 to 1000000, not '" + text + "'");
      }
      options.repeat = static_cast<int>(repeat);
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg.starts_with("--")) {
      throw std::runtime_error("unknown option " + arg);
    } else if (options.model.empty()) {
      options.model = arg;
    } else {
      options.inputs.push_back(arg);
    }
  }
  if (options.model.empty()) {
    throw std::runtime_error("no model given");
  }
  return options;
}

struct DtypeName {
  ScalarType type;
  const char* descr;
};
constexpr DtypeName kDtypes[] = {
    {ScalarType::Bool, "|b1"},  {ScalarType::Byte, "|u1"}, {ScalarType::Char, "|i1"},
    {ScalarType::Short, "<i2"}, {ScalarType::Int, "<i4"},  {ScalarType::Long, "<i8"},
    {ScalarType::Half, "<f2"},  {ScalarType::Float, "<f4"}, {ScalarType::Double, "<f8"},
    {ScalarType::BFloat16, "<u2"},
};

const char* descr_of(ScalarType type) {
  for (const auto& entry : kDtypes) {
    if (entry.type == type) {
      return entry.descr;
    }
  }
  throw std::runtime_error("output of scalar type " + std::to_string(static_cast<int>(type)) +
                           " has no .npy equivalent");
}

std::string error_text(et::Error error) {
  char code[32];
  std::snprintf(code, sizeof(code), "ExecuTorch error 0x%02x", static_cast<unsigned>(error));
  const std::string text = code;
  const std::string reason = etmlx_native_last_error();
  return reason.empty() ? text : text + ": " + reason;
}

std::vector<et::EValue> read_inputs(Module& module, const Options& options,
                                    std::vector<executorch::extension::TensorPtr>& keep) {
  auto meta = module.method_meta(options.method);
  if (!meta.ok()) {
    throw std::runtime_error("no method '" + options.method + "' in " + options.model + " (" +
                             error_text(meta.error()) + ")");
  }
  if (options.inputs.size() != meta->num_inputs()) {
    throw std::runtime_error("method '" + options.method + "' takes " + std::to_string(meta->num_inputs()) +
                             " inputs, " + std::to_string(options.inputs.size()) + " given");
  }
  std::vector<et::EValue> inputs;
  for (size_t i = 0; i < options.inputs.size(); ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) {
      throw std::runtime_error("input " + std::to_string(i) + " is not a tensor; etmlx_run passes tensors only");
    }
    auto array = std::make_shared<etmlx::npy::Array>(etmlx::npy::read(options.inputs[i]));
    const std::string expected = descr_of(info->scalar_type());
    if (array->descr != expected) {
      throw std::runtime_error(options.inputs[i] + ": dtype '" + array->descr + "', input " + std::to_string(i) +
                               " expects '" + expected + "'");
    }
    std::vector<executorch::aten::SizesType> sizes;
    for (int64_t dim : array->shape) {
      if (dim > std::numeric_limits<executorch::aten::SizesType>::max()) {
        throw std::runtime_error(options.inputs[i] + ": dimension " + std::to_string(dim) + " is too large");
      }
      sizes.push_back(static_cast<executorch::aten::SizesType>(dim));
    }
    keep.push_back(executorch::extension::make_tensor_ptr(
        sizes, array->data.data(), info->scalar_type(), executorch::aten::Device(executorch::aten::DeviceType::CPU),
        executorch::aten::TensorShapeDynamism::DYNAMIC_BOUND, [array](void*) {}));
    inputs.emplace_back(*keep.back());
  }
  return inputs;
}

void write_outputs(const std::vector<et::EValue>& outputs, const Options& options) {
  std::filesystem::create_directories(options.output_dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].isTensor()) {
      std::printf("output %zu: not a tensor, not written\n", i);
      continue;
    }
    const auto& tensor = outputs[i].toTensor();
    etmlx::npy::Array array{descr_of(tensor.scalar_type()), {}, {}};
    for (auto size : tensor.sizes()) {
      array.shape.push_back(size);
    }
    const auto* data = static_cast<const uint8_t*>(tensor.const_data_ptr());
    array.data.assign(data, data + tensor.nbytes());
    const auto path = (std::filesystem::path(options.output_dir) / ("output_" + std::to_string(i) + ".npy")).string();
    etmlx::npy::write(path, array);
    std::string shape;
    for (size_t d = 0; d < array.shape.size(); ++d) {
      shape += (d ? ", " : "") + std::to_string(array.shape[d]);
    }
    std::printf("output %zu: %s (%s) -> %s\n", i, array.descr.c_str(), shape.c_str(), path.c_str());
  }
}

int run(const Options& options) {
  if (!etmlx_native_registered()) {
    throw std::runtime_error("the EtMlxBackend did not register with ExecuTorch");
  }
  Module module(options.model, Module::LoadMode::Mmap);
  if (const auto loaded = module.load(); loaded != et::Error::Ok) {
    throw std::runtime_error("cannot load " + options.model + ": " + error_text(loaded));
  }
  std::vector<executorch::extension::TensorPtr> keep;
  const auto inputs = read_inputs(module, options, keep);
  std::vector<double> times_ms;
  std::vector<et::EValue> outputs;
  for (int i = 0; i < options.repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto result = module.execute(options.method, inputs);
    times_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (!result.ok()) {
      throw std::runtime_error("method '" + options.method + "' failed: " + error_text(result.error()));
    }
    outputs = std::move(*result);
  }
  write_outputs(outputs, options);
  // The first call also loads the method (its delegates) and traces the graph.
  std::printf("%s: first call %.3f ms", options.method.c_str(), times_ms.front());
  if (times_ms.size() > 1) {
    std::vector<double> rest(times_ms.begin() + 1, times_ms.end());
    std::sort(rest.begin(), rest.end());
    std::printf(", median of the next %zu: %.3f ms", rest.size(), rest[rest.size() / 2]);
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "etmlx_run: error: %s\n%s", e.what(), std::strstr(e.what(), "no model") ? kUsage : "");
    return 1;
  }
}
