// Matmul, Addmm and GatherMm.
#include <optional>
#include <stdexcept>
#include <string>

#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

mx::array matmul(const etmlx_ir::Matmul& op, Env& env) { return mx::matmul(env.t(op.a()), env.t(op.b())); }

mx::array addmm(const etmlx_ir::Addmm& op, Env& env) {
  return mx::addmm(env.t(op.c()), env.t(op.a()), env.t(op.b()), op.alpha(), op.beta());
}

// a[i] @ b[rhs_indices[i]]; the indices are clamped into b's experts first: MLX
// reads whatever memory an index points at. MLX's CPU gather_mm takes float32 only:
// other dtypes on the CPU gather the matrices and multiply, as the unfused graph does.
mx::array gather_mm(const etmlx_ir::GatherMm& op, Env& env) {
  const mx::array& b = env.t(op.b());
  mx::array indices = env.t(op.rhs_indices());
  if (b.ndim() != 3 || b.shape(0) == 0) {
    throw std::invalid_argument("gather_mm over weights of " + std::to_string(b.ndim()) +
                                " dimensions or no experts: expected (experts, K, N)");
  }
  if (!mx::issubdtype(indices.dtype(), mx::integer)) {
    throw std::invalid_argument("gather_mm indices must be integers");
  }
  if (indices.dtype() != mx::int32 && indices.dtype() != mx::int64) {
    indices = mx::astype(indices, mx::int64);
  }
  const auto dtype = indices.dtype();
  const mx::array safe = mx::clip(indices, mx::array(0, dtype), mx::array(b.shape(0) - 1, dtype));
  if (mx::default_device() == mx::Device::cpu && b.dtype() != mx::float32) {
    return mx::matmul(env.t(op.a()), mx::take(b, safe, 0));
  }
  return mx::gather_mm(env.t(op.a()), b, std::nullopt, safe);
}

}  // namespace

void register_matmul(Registry& r) {
  r.tensor<etmlx_ir::Matmul, matmul>();
  r.tensor<etmlx_ir::Addmm, addmm>();
  r.tensor<etmlx_ir::GatherMm, gather_mm>();
}

}  // namespace etmlx::native
