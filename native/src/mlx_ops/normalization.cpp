// Softmax, LogSoftmax, LayerNorm, RmsNorm.
#include <optional>

#include <mlx/fast.h>
#include <mlx/ops.h>

#include "cpu_math.h"
#include "registry.h"

namespace etmlx::native {

namespace {

// MLX's softmax, or on MLX's CPU the faster form of cpu_math.
mx::array softmax(const etmlx_ir::Softmax& op, Env& env) {
  const auto& x = env.t(op.x());
  if (mx::default_device() == mx::Device::cpu && cpu_math::float32_or_narrower(x)) {
    return cpu_math::softmax(x, op.axis());
  }
  return mx::softmax(x, std::vector<int>{op.axis()}, /*precise=*/true);
}

// PyTorch accumulates half-precision log-softmax in float32.
mx::array log_softmax(const etmlx_ir::LogSoftmax& op, Env& env) {
  const auto& x = floating_operand(env.t(op.x()), "log-softmax");
  const auto wide = mx::astype(x, mx::float32);
  return mx::astype(mx::subtract(wide, mx::logsumexp(wide, op.axis(), /*keepdims=*/true)), x.dtype());
}

mx::array layer_norm(const etmlx_ir::LayerNorm& op, Env& env) {
  return mx::fast::layer_norm(env.t(op.x()), env.t_if(op.has_weight(), op.weight()),
                              env.t_if(op.has_bias(), op.bias()), op.eps());
}

mx::array rms_norm(const etmlx_ir::RmsNorm& op, Env& env) {
  return mx::fast::rms_norm(env.t(op.x()), env.t_if(op.has_weight(), op.weight()), op.eps());
}

}  // namespace

void register_normalization(Registry& r) {
  r.tensor<etmlx_ir::Softmax, softmax>();
  r.tensor<etmlx_ir::LogSoftmax, log_softmax>();
  r.tensor<etmlx_ir::LayerNorm, layer_norm>();
  r.tensor<etmlx_ir::RmsNorm, rms_norm>();
}

}  // namespace etmlx::native
