// Matmul, Addmm and GatherMm.
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

#include <mlx/ops.h>

#include "experts.h"
#include "products.h"
#include "registry.h"

namespace etmlx::native {

namespace {

// The matrix b views transposed, where a @ b is one float32 row times such a view on
// the CPU: a linear layer's weight, stored as the checkpoint holds it, (out, in), in a
// decode step. There BLAS's product of a row with a transposed operand read a decode
// step's weights at ~2/3 of the speed of the matrix-vector product over the stored
// rows, W @ a, which the callers compute (runtime_shim/mlx_ops/matmul.py, the same
// rule). Nothing elsewhere: bfloat16 and float16 run MLX's own loops; over more rows
// W @ a^T was faster in most calls but not steadily, the view's product steady.
std::optional<mx::array> stored_rows(const mx::array& a, const mx::array& b, const etmlx_ir::Tid* b_ref,
                                     const Env& env) {
  if (!env.transposed_matrix(b_ref) || mx::default_device() != mx::Device::cpu || a.dtype() != mx::float32 ||
      b.dtype() != mx::float32 || a.ndim() == 0 ||
      std::accumulate(a.shape().begin(), a.shape().end() - 1, int64_t{1}, std::multiplies<>()) != 1) {
    return std::nullopt;
  }
  return mx::transpose(b);
}

// a as one column.
mx::array column(const mx::array& a) { return mx::reshape(a, {-1, 1}); }

// a @ b; over an inner size of 1 (an outer product: a state-space scan's update in a
// decode step) as the broadcast product it equals, which compile fuses with
// its neighbours instead of a matmul per batch entry and a buffer between.
mx::array matmul(const etmlx_ir::Matmul& op, Env& env) {
  const mx::array& a = env.t(op.a());
  const mx::array& b = env.t(op.b());
  if (a.ndim() >= 2 && b.ndim() >= 2 && a.shape(-1) == 1 && b.shape(-2) == 1) {
    return mx::multiply(a, b);
  }
  if (const auto matrix = stored_rows(a, b, op.b(), env)) {
    mx::Shape shape(a.shape().begin(), a.shape().end() - 1);
    shape.push_back(matrix->shape(0));
    return mx::reshape(mx::matmul(*matrix, column(a)), std::move(shape));
  }
  return product(a, b);
}

mx::array addmm(const etmlx_ir::Addmm& op, Env& env) {
  const mx::array& c = env.t(op.c());
  const mx::array& a = env.t(op.a());
  const mx::array& b = env.t(op.b());
  if (const auto matrix = stored_rows(a, b, op.b(), env);
      matrix && (c.size() == 1 || c.size() == static_cast<size_t>(b.shape(-1)))) {
    return mx::reshape(mx::addmm(column(c), *matrix, column(a), op.alpha(), op.beta()), {a.shape(0), matrix->shape(0)});
  }
  if (widened_on_cpu(a, b) && c.dtype() == a.dtype()) {
    const auto wide = [](const mx::array& t) { return mx::astype(t, mx::float32); };
    return mx::astype(mx::addmm(wide(c), wide(a), wide(b), op.alpha(), op.beta()), a.dtype());
  }
  return mx::addmm(c, a, b, op.alpha(), op.beta());
}

// a[i] @ b[rhs_indices[i]], the indices clamped into b's matrices. MLX's CPU gather_mm
// takes float32 only: other dtypes on the CPU gather the matrices and multiply, as the
// unfused graph does.
mx::array gather_mm(const etmlx_ir::GatherMm& op, Env& env) {
  const mx::array& b = env.t(op.b());
  if (b.ndim() != 3) {
    throw std::invalid_argument("gather_mm over weights of " + std::to_string(b.ndim()) +
                                " dimensions: expected (experts, K, N)");
  }
  const mx::array safe = clamped_expert_indices(env.t(op.rhs_indices()), b.shape(0), "gather_mm");
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
