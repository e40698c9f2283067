// Sdpa (MLX's fused attention kernel), Rope (its rotary embedding kernel), Roll, and
// GatedDelta (its kernel of the gated delta rule: linear attention).
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mlx/fast.h>
#include <mlx/ops.h>

#include "cpu_math.h"
#include "registry.h"

namespace etmlx::native {

namespace {

// MLX's fused attention, or on MLX's CPU (where MLX computes it from products and a
// softmax anyway) the same computation with cpu_math's faster softmax.
mx::array sdpa(const etmlx_ir::Sdpa& op, Env& env) {
  const std::string mode = op.has_mask() ? "" : (op.causal() ? "causal" : "");
  const auto mask = env.t_if(op.has_mask(), op.mask());
  const auto &q = env.t(op.q()), &k = env.t(op.k()), &v = env.t(op.v());
  if (mx::default_device() == mx::Device::cpu) {
    return cpu_math::attention(q, k, v, op.scale(), mode, mask);
  }
  return mx::fast::scaled_dot_product_attention(q, k, v, op.scale(), mode, mask);
}

void check_rope(const mx::array& x, int dims, const mx::array& offset, const mx::array& freqs) {
  if (x.ndim() < 3 || !mx::issubdtype(x.dtype(), mx::floating) || dims != x.shape(-1) || dims % 2 != 0) {
    throw std::invalid_argument("rope over " + std::to_string(dims) + " of a tensor whose last axis has " +
                                std::to_string(x.ndim() == 0 ? 0 : x.shape(-1)) + " (rank " +
                                std::to_string(x.ndim()) + ")");
  }
  if (offset.size() != 1 || !mx::issubdtype(offset.dtype(), mx::integer)) {
    throw std::invalid_argument("rope offset: expected one integer");
  }
  if (freqs.ndim() != 1 || freqs.shape(0) != dims / 2 || freqs.dtype() != mx::float32) {
    throw std::invalid_argument("rope frequencies: expected " + std::to_string(dims / 2) + " float32");
  }
}

// MLX's own CPU computation of rope's angles (mlx/fast.cpp), in its order.
std::vector<mx::array> rope_cos_sin(int tokens, const mx::array& offset, const mx::array& freqs, mx::Dtype dtype) {
  const auto positions = mx::add(mx::arange(tokens, mx::float32), mx::astype(mx::reshape(offset, {}), mx::int32));
  const auto angles = mx::multiply(mx::expand_dims(positions, 1), mx::reciprocal(freqs));
  return {mx::astype(mx::cos(angles), dtype), mx::astype(mx::sin(angles), dtype)};
}

// mx::fast::rope, a kernel on a GPU. On the CPU MLX computes it as cosines and sines
// then products, per node: there the same products are written out here, with the
// cosines and sines made once for all the Rope nodes at the same positions (the q and
// k of every layer), which halves its cost.
mx::array rope(const etmlx_ir::Rope& op, Env& env) {
  const auto& x = env.t(op.x());
  const auto& offset = env.t(op.offset());
  const auto& freqs = env.t(op.freqs());
  check_rope(x, op.dims(), offset, freqs);
  if (mx::default_device() != mx::Device::cpu) {
    return mx::fast::rope(x, op.dims(), /*traditional=*/false, /*base=*/std::nullopt, /*scale=*/1.0F, offset, freqs);
  }
  const int tokens = x.shape(-2);
  const std::vector<int64_t> key = {op.offset()->idx(), op.freqs()->idx(), tokens, static_cast<int64_t>(x.dtype().val())};
  const auto& cos_sin = env.shared(key, [&] { return rope_cos_sin(tokens, offset, freqs, x.dtype()); });
  const auto& cos = cos_sin[0];
  const auto& sin = cos_sin[1];
  const int half = op.dims() / 2;
  auto start = mx::Shape(x.ndim(), 0);
  auto middle = x.shape();
  middle.back() = half;
  auto x1 = mx::slice(x, start, middle);
  start.back() = half;
  auto x2 = mx::slice(x, start, x.shape());
  return mx::concatenate({mx::subtract(mx::multiply(x1, cos), mx::multiply(x2, sin)),
                          mx::add(mx::multiply(x1, sin), mx::multiply(x2, cos))},
                         -1);
}

std::vector<mx::array> gated_delta_update(const mx::array& q, const mx::array& k, const mx::array& v,
                                          const mx::array& gamma, const mx::array& beta, const mx::array& state) {
  for (const mx::array* x : {&q, &k, &v, &gamma, &beta, &state}) {
    if (x->dtype() != mx::float32) {
      throw std::invalid_argument("gated delta rule over operands other than float32");
    }
  }
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || gamma.ndim() != 3 || beta.ndim() != 3 || state.ndim() != 4) {
    throw std::invalid_argument(
        "gated delta rule over operands of other ranks than q, k, v (B, T, H, D), gamma, beta (B, T, Hv), state (B, "
        "Hv, Dv, Dk)");
  }
  const int batch = q.shape(0);
  const int steps = q.shape(1);
  const int key_heads = q.shape(2);
  const int value_heads = v.shape(2);
  const mx::Shape gates = {batch, steps, value_heads};
  const mx::Shape states = {batch, value_heads, v.shape(3), q.shape(3)};
  if (k.shape() != q.shape() || v.shape(0) != batch || v.shape(1) != steps || gamma.shape() != gates ||
      beta.shape() != gates || state.shape() != states || steps < 1 || key_heads < 1 || value_heads % key_heads != 0) {
    throw std::invalid_argument("gated delta rule over operands whose shapes do not agree");
  }
  if (steps > 1 && mx::default_device() == mx::Device::cpu) {
    return cpu_math::gated_delta_chunks(q, k, v, gamma, beta, state);
  }
  return mx::fast::gated_delta_update(q, k, v, gamma, beta, state);
}

// Both results of mx::fast::gated_delta_update, made once per call for the output node
// and the state node of the same operands.
mx::array gated_delta(const etmlx_ir::GatedDelta& op, Env& env) {
  const std::vector<const etmlx_ir::Tid*> refs = {op.q(), op.k(), op.v(), op.gamma(), op.beta(), op.state()};
  std::vector<int64_t> key = {-static_cast<int64_t>(etmlx_ir::Op::GatedDelta)};
  for (const auto* ref : refs) {
    key.push_back(ref->idx());
  }
  const auto& results = env.shared(key, [&] {
    return gated_delta_update(env.t(op.q()), env.t(op.k()), env.t(op.v()), env.t(op.gamma()), env.t(op.beta()),
                              env.t(op.state()));
  });
  return results[op.final_state() ? 1 : 0];
}

mx::array roll(const etmlx_ir::Roll& op, Env& env) {
  const auto shifts = ints(op.shifts());
  return mx::roll(env.t(op.x()), mx::Shape(shifts.begin(), shifts.end()), ints(op.axes()));
}

}  // namespace

void register_attention(Registry& r) {
  r.tensor<etmlx_ir::Sdpa, sdpa>();
  r.tensor<etmlx_ir::Rope, rope>();
  r.tensor<etmlx_ir::Roll, roll>();
  r.tensor<etmlx_ir::GatedDelta, gated_delta>();
}

}  // namespace etmlx::native
