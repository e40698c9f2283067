// Reduce, Variance, ArgReduce.
#include <mlx/ops.h>

#include "mlx_functions.h"
#include "registry.h"

namespace etmlx::native {

namespace {

using mlx_functions::kArgReduceOp;
using mlx_functions::kReduceOp;
static_assert(covers_enum(kReduceOp), "every ReduceOp needs a function, in enum order");
static_assert(covers_enum(kArgReduceOp), "every ArgReduceOp needs a function, in enum order");

mx::array reduce(const etmlx_ir::Reduce& op, Env& env) {
  return kReduceOp[static_cast<size_t>(op.op())].second(env.t(op.x()), ints(op.axes()), op.keepdims());
}

mx::array arg_reduce(const etmlx_ir::ArgReduce& op, Env& env) {
  return kArgReduceOp[static_cast<size_t>(op.op())].second(env.t(op.x()), op.axis(), op.keepdims());
}

// PyTorch accumulates half-precision variance in float32.
mx::array variance(const etmlx_ir::Variance& op, Env& env) {
  const auto& x = floating_operand(env.t(op.x()), "variance");
  const bool half = x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
  const auto wide = half ? mx::astype(x, mx::float32) : x;
  return mx::astype(mx::var(wide, ints(op.axes()), op.keepdims(), op.ddof()), x.dtype());
}

}  // namespace

void register_reduction(Registry& r) {
  r.tensor<etmlx_ir::Reduce, reduce>();
  r.tensor<etmlx_ir::ArgReduce, arg_reduce>();
  r.tensor<etmlx_ir::Variance, variance>();
  r.operations("Reduce", enum_names(kReduceOp, etmlx_ir::EnumNameReduceOp));
  r.operations("ArgReduce", enum_names(kArgReduceOp, etmlx_ir::EnumNameArgReduceOp));
}

}  // namespace etmlx::native
