// Sdpa (MLX's fused attention kernel) and Roll.
#include <mlx/fast.h>
#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

mx::array sdpa(const etmlx_ir::Sdpa& op, Env& env) {
  if (op.has_mask()) {
    return mx::fast::scaled_dot_product_attention(env.t(op.q()), env.t(op.k()), env.t(op.v()), op.scale(), "",
                                                  env.t(op.mask()));
  }
  return mx::fast::scaled_dot_product_attention(env.t(op.q()), env.t(op.k()), env.t(op.v()), op.scale(),
                                                op.causal() ? "causal" : "");
}

mx::array roll(const etmlx_ir::Roll& op, Env& env) {
  const auto shifts = ints(op.shifts());
  return mx::roll(env.t(op.x()), mx::Shape(shifts.begin(), shifts.end()), ints(op.axes()));
}

}  // namespace

void register_attention(Registry& r) {
  r.tensor<etmlx_ir::Sdpa, sdpa>();
  r.tensor<etmlx_ir::Roll, roll>();
}

}  // namespace etmlx::native
