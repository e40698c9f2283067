// Reduce, Variance, ArgReduce.
#include <array>
#include <utility>

#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

using etmlx_ir::ArgReduceOp;
using etmlx_ir::ReduceOp;
using ReduceFn = mx::array (*)(const mx::array&, const std::vector<int>&, bool);
using ArgReduceFn = mx::array (*)(const mx::array&, int, bool);

constexpr std::array<std::pair<ReduceOp, ReduceFn>, 7> kReduce = {{
    {ReduceOp::Sum, [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::sum(x, axes, keep); }},
    {ReduceOp::Mean,
     [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::mean(x, axes, keep); }},
    {ReduceOp::Max, [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::max(x, axes, keep); }},
    {ReduceOp::Min, [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::min(x, axes, keep); }},
    {ReduceOp::Prod,
     [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::prod(x, axes, keep); }},
    {ReduceOp::Any, [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::any(x, axes, keep); }},
    {ReduceOp::All, [](const mx::array& x, const std::vector<int>& axes, bool keep) { return mx::all(x, axes, keep); }},
}};
static_assert(covers_enum(kReduce), "every ReduceOp needs a handler, in enum order");

constexpr std::array<std::pair<ArgReduceOp, ArgReduceFn>, 2> kArgReduce = {{
    {ArgReduceOp::ArgMax, [](const mx::array& x, int axis, bool keep) { return mx::argmax(x, axis, keep); }},
    {ArgReduceOp::ArgMin, [](const mx::array& x, int axis, bool keep) { return mx::argmin(x, axis, keep); }},
}};
static_assert(covers_enum(kArgReduce), "every ArgReduceOp needs a handler, in enum order");

mx::array reduce(const etmlx_ir::Reduce& op, Env& env) {
  return kReduce[static_cast<size_t>(op.op())].second(env.t(op.x()), ints(op.axes()), op.keepdims());
}

mx::array arg_reduce(const etmlx_ir::ArgReduce& op, Env& env) {
  return kArgReduce[static_cast<size_t>(op.op())].second(env.t(op.x()), op.axis(), op.keepdims());
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
  r.operations("Reduce", enum_names(kReduce, etmlx_ir::EnumNameReduceOp));
  r.operations("ArgReduce", enum_names(kArgReduce, etmlx_ir::EnumNameArgReduceOp));
}

}  // namespace etmlx::native
