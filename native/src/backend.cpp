// EtMlxBackend: etmlx's delegates in ExecuTorch's C++ runtime. Registered under
// the id the .pte names when this library is loaded.
#include <cinttypes>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/log.h>
#include <mlx/transforms.h>

#include "constants.h"
#include "delegate.h"
#include "errors.h"
#include "mlx_lock.h"
#include "tensor_io.h"

namespace etmlx::native {

std::mutex& mlx_mutex() {
  static std::mutex mutex;
  return mutex;
}

namespace {

namespace et = executorch::runtime;

et::Error fail(et::Error code, ErrorKind kind, const char* method, const std::string& what) {
  std::string detail = printable(what);
  std::string message = std::string(kBackendId) + ", method '" + printable(method ? method : "?") + "': " + detail;
  ET_LOG(Error, "%s", message.c_str());
  set_last_error({kind, std::move(detail), std::move(message)});
  return code;
}

// Runs `body`, turning each kind of exception into its ExecuTorch error.
template <class Body>
et::Error guarded(const char* method, et::Error otherwise, Body&& body) {
  try {
    body();
    return et::Error::Ok;
  } catch (const VersionError& e) {
    return fail(et::Error::DelegateInvalidCompatibility, ErrorKind::Version, method, e.what());
  } catch (const FormatError& e) {
    return fail(et::Error::InvalidProgram, ErrorKind::Format, method, e.what());
  } catch (const InputError& e) {
    return fail(et::Error::InvalidArgument, ErrorKind::Input, method, e.what());
  } catch (const IndexRangeError& e) {
    return fail(et::Error::InvalidArgument, ErrorKind::IndexRange, method, e.what());
  } catch (const std::bad_alloc&) {
    return fail(et::Error::MemoryAllocationFailed, ErrorKind::Memory, method, "out of memory");
  } catch (const std::exception& e) {
    return fail(otherwise, ErrorKind::Other, method, e.what());
  }
}

// What ExecuTorch's init hands a delegate, kept for execute's messages.
struct Handle {
  std::unique_ptr<Delegate> delegate;
  std::string method;
};

std::vector<Value> read_inputs(const Delegate& delegate, std::span<et::EValue*> args) {
  std::vector<Value> inputs;
  for (size_t i = 0; i < delegate.num_inputs(); ++i) {
    const et::EValue& arg = *args[i];
    if (arg.isTensor()) {
      inputs.emplace_back(read_tensor(arg.toTensor()));
    } else if (arg.isInt()) {
      inputs.emplace_back(arg.toInt());
    } else {
      throw InputError("delegate input " + std::to_string(i) + " is neither a tensor nor an integer");
    }
  }
  return inputs;
}

void run(Delegate& delegate, std::span<et::EValue*> args) {
  if (args.size() != delegate.num_inputs() + delegate.num_outputs()) {
    throw FormatError("the delegate call passes " + std::to_string(args.size()) + " arguments; the delegate takes " +
                      std::to_string(delegate.num_inputs()) + " inputs and " + std::to_string(delegate.num_outputs()) +
                      " outputs");
  }
  auto results = delegate.compute(read_inputs(delegate, args));
  std::vector<mx::array> checks = results.checked_indices;
  checks.insert(checks.end(), results.checked_sizes.begin(), results.checked_sizes.end());
  mx::eval(checks);
  delegate.verify(results);  // throws IndexRangeError before any output or state is written
  const auto outputs = args.subspan(delegate.num_inputs());
  std::vector<PreparedOutput> prepared;
  std::vector<mx::array> to_evaluate = results.buffer_updates;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (const auto* array = std::get_if<mx::array>(&results.outputs[i])) {
      if (!outputs[i]->isTensor()) {
        throw FormatError("delegate output " + std::to_string(i) + " is a tensor, the program expects none");
      }
      prepared.push_back(prepare_output(*array, outputs[i]->toTensor()));
      to_evaluate.push_back(prepared.back().data);
    }
  }
  // Committed before evaluation: the state then no longer holds a buffer's old value
  // when its update is computed, so MLX writes the update into that memory (a KV-cache
  // write touches its slots instead of copying the whole cache).
  delegate.commit(std::move(results.buffer_updates));
  mx::eval(to_evaluate);
  size_t next = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (const auto* size = std::get_if<int64_t>(&results.outputs[i])) {
      *outputs[i] = et::EValue(*size);
    } else {
      auto tensor = outputs[i]->toTensor();
      write_output(prepared[next++], tensor);
    }
  }
}

class EtMlxBackend final : public et::BackendInterface {
 public:
  bool is_available() const override { return true; }

  et::Result<et::DelegateHandle*> init(et::BackendInitContext& context, et::FreeableBuffer* processed,
                                       et::ArrayRef<et::CompileSpec>) const override {
    std::lock_guard lock(mlx_mutex());
    const char* method = context.get_method_name();
    auto handle = std::make_unique<Handle>();
    handle->method = method ? method : "?";
    const auto status = guarded(method, et::Error::InvalidProgram, [&] {
      const auto data = processed == nullptr ? et::Result<const void*>(et::Error::InvalidArgument) : processed->data_safe();
      if (!data.ok() || data.get() == nullptr) {
        throw FormatError("the delegate has no payload");
      }
      auto payload = read_payload({static_cast<const uint8_t*>(data.get()), processed->size()});
      processed->Free();  // the payload keeps its own copy of the graph
      const auto* named_data = context.get_named_data_map();
      handle->delegate = std::make_unique<Delegate>(std::move(payload), named_data, program_state(named_data));
    });
    if (status != et::Error::Ok) {
      return status;
    }
    return handle.release();  // ExecuTorch owns it until destroy()
  }

  et::Error execute(et::BackendExecutionContext&, et::DelegateHandle* opaque,
                    et::Span<et::EValue*> args) const override {
    std::lock_guard lock(mlx_mutex());
    auto& handle = *static_cast<Handle*>(opaque);
    return guarded(handle.method.c_str(), et::Error::Internal,
                   [&] { run(*handle.delegate, std::span<et::EValue*>(args.data(), args.size())); });
  }

  void destroy(et::DelegateHandle* opaque) const override {
    std::lock_guard lock(mlx_mutex());
    const std::unique_ptr<Handle> reclaimed(static_cast<Handle*>(opaque));  // what init released
  }
};

EtMlxBackend backend;

const bool registered = [] {
  const auto status = et::register_backend({kBackendId, &backend});
  if (status != et::Error::Ok) {
    ET_LOG(Error, "%s: registration failed with error 0x%" PRIx32, kBackendId, static_cast<uint32_t>(status));
  }
  return status == et::Error::Ok;
}();

}  // namespace

bool backend_registered() { return registered; }

}  // namespace etmlx::native
