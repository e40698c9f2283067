// Full and Arange.
#include <stdexcept>

#include <mlx/ops.h>

#include "../dtypes.h"
#include "registry.h"
#include "scalars.h"

namespace etmlx::native {

namespace {

// mx.full(shape, vals) with the value already an array of the dtype: mlx's
// full ignores a dtype given beside a Python float.
mx::array full(const etmlx_ir::Full& op, Env& env) {
  return mx::full(env.shape(op.shape()), fill_value(op.value(), op.int_value(), mlx_dtype(op.dtype())));
}

// As mlx's Python arange: bounds and step as doubles, the dtype given.
mx::array arange(const etmlx_ir::Arange& op, Env& env) {
  if (op.step() == 0) {
    throw std::invalid_argument("arange step cannot be zero");
  }
  return mx::arange(static_cast<double>(env.size(op.start())), static_cast<double>(env.size(op.stop())),
                    static_cast<double>(op.step()), mlx_dtype(op.dtype()));
}

}  // namespace

void register_creation(Registry& r) {
  r.tensor<etmlx_ir::Full, full>();
  r.tensor<etmlx_ir::Arange, arange>();
}

}  // namespace etmlx::native
