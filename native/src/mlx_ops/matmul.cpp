// Matmul and Addmm.
#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

mx::array matmul(const etmlx_ir::Matmul& op, Env& env) { return mx::matmul(env.t(op.a()), env.t(op.b())); }

mx::array addmm(const etmlx_ir::Addmm& op, Env& env) {
  return mx::addmm(env.t(op.c()), env.t(op.a()), env.t(op.b()), op.alpha(), op.beta());
}

}  // namespace

void register_matmul(Registry& r) {
  r.tensor<etmlx_ir::Matmul, matmul>();
  r.tensor<etmlx_ir::Addmm, addmm>();
}

}  // namespace etmlx::native
