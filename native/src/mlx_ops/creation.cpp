// Full, Arange and RandomUniform.
#include <stdexcept>
#include <string>

#include <mlx/ops.h>
#include <mlx/random.h>

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

// mx::random::uniform keyed as mx::random::key(seed) keys it, the key built from the
// seed in the graph (its high and low 32 bits): a compiled graph draws anew per seed.
mx::array random_uniform(const etmlx_ir::RandomUniform& op, Env& env) {
  const mx::array& given = env.t(op.seed());
  if (!mx::issubdtype(given.dtype(), mx::integer) || given.size() != 1) {
    throw std::invalid_argument("RandomUniform: a seed of " + std::to_string(given.size()) +
                                " elements, or not of an integer dtype (one integer)");
  }
  const mx::array seed = mx::astype(mx::reshape(given, {}), mx::int64);
  const mx::array high = mx::astype(mx::right_shift(seed, mx::array(32, mx::int64)), mx::uint32);
  const mx::array key = mx::stack({high, mx::astype(seed, mx::uint32)});
  return mx::random::uniform(env.shape(op.shape()), mx::float32, key);
}

}  // namespace

void register_creation(Registry& r) {
  r.tensor<etmlx_ir::Full, full>();
  r.tensor<etmlx_ir::Arange, arange>();
  r.tensor<etmlx_ir::RandomUniform, random_uniform>();
}

}  // namespace etmlx::native
