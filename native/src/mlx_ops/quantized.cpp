// Weight-only quantized kernels: QuantizedMatmul (a linear layer's weight), Dequantize
// (rows gathered from a quantized embedding) and GatherQmm (quantized experts). MLX checks that the packed
// weights, scales and biases agree in shape and dtype; the parameters are checked here.
#include <algorithm>
#include <stdexcept>
#include <string>

#include <mlx/ops.h>

#include "constants.h"
#include "experts.h"
#include "registry.h"

namespace etmlx::native {

namespace {

struct Quantization {
  int group_size;
  int bits;
};

template <class Table>
Quantization quantization(const Table& op) {
  const int bits = op.bits();
  const int group_size = op.group_size();
  if (std::ranges::find(kQuantizedBits, bits) == kQuantizedBits.end() ||
      std::ranges::find(kQuantizedGroupSizes, group_size) == kQuantizedGroupSizes.end()) {
    const auto list = [](const auto& values) {
      std::string text;
      for (int v : values) {
        text += (text.empty() ? "" : ", ") + std::to_string(v);
      }
      return text;
    };
    throw std::invalid_argument("quantized weights of " + std::to_string(bits) + " bits in groups of " +
                                std::to_string(group_size) + " (etmlx writes bits " + list(kQuantizedBits) +
                                " and groups of " + list(kQuantizedGroupSizes) + ")");
  }
  return {group_size, bits};
}

mx::array quantized_matmul(const etmlx_ir::QuantizedMatmul& op, Env& env) {
  const auto [group_size, bits] = quantization(op);
  return mx::quantized_matmul(env.t(op.x()), env.t(op.w()), env.t(op.scales()), env.t(op.biases()),
                              /*transpose=*/true, group_size, bits);
}

mx::array dequantize(const etmlx_ir::Dequantize& op, Env& env) {
  const auto [group_size, bits] = quantization(op);
  return mx::dequantize(env.t(op.w()), env.t(op.scales()), env.t(op.biases()), group_size, bits);
}

mx::array gather_qmm(const etmlx_ir::GatherQmm& op, Env& env) {
  const auto [group_size, bits] = quantization(op);
  const mx::array& w = env.t(op.w());
  if (w.ndim() != 3) {
    throw std::invalid_argument("gather_qmm over packed weights of " + std::to_string(w.ndim()) +
                                " dimensions: expected (experts, N, K packed)");
  }
  const mx::array safe = clamped_expert_indices(env.t(op.rhs_indices()), w.shape(0), "gather_qmm");
  return mx::gather_qmm(env.t(op.x()), w, env.t(op.scales()), env.t(op.biases()), std::nullopt, safe,
                        op.transpose(), group_size, bits);
}

}  // namespace

void register_quantized(Registry& r) {
  r.tensor<etmlx_ir::QuantizedMatmul, quantized_matmul>();
  r.tensor<etmlx_ir::Dequantize, dequantize>();
  r.tensor<etmlx_ir::GatherQmm, gather_qmm>();
}

}  // namespace etmlx::native
