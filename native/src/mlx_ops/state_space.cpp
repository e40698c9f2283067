// SelectiveScan: Mamba's selective state-space scan, step by step from a stored state.
// MLX has no kernel for it; the per-step work is one multiply-add over the (B, D, N)
// state, with the decays, inputs and readout made for all steps at once around the loop.
#include <stdexcept>
#include <vector>

#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

std::vector<mx::array> selective_scan(const mx::array& x, const mx::array& dt, const mx::array& a, const mx::array& b,
                                      const mx::array& c, mx::array state) {
  for (const mx::array* t : {&x, &dt, &a, &b, &c, static_cast<const mx::array*>(&state)}) {
    if (t->dtype() != mx::float32) {
      throw std::invalid_argument("selective scan over operands other than float32");
    }
  }
  if (x.ndim() != 3 || dt.ndim() != 3 || a.ndim() != 2 || b.ndim() != 3 || c.ndim() != 3 || state.ndim() != 3) {
    throw std::invalid_argument(
        "selective scan over operands of other ranks than x, dt (B, T, D), a (D, N), b, c (B, T, N), state (B, D, N)");
  }
  const int batch = x.shape(0);
  const int steps = x.shape(1);
  const int channels = x.shape(2);
  const int size = a.shape(1);
  const mx::Shape inputs_shape = {batch, steps, size};
  if (dt.shape() != x.shape() || a.shape(0) != channels || b.shape() != inputs_shape || c.shape() != inputs_shape ||
      state.shape() != mx::Shape{batch, channels, size} || steps < 1) {
    throw std::invalid_argument("selective scan over operands whose shapes do not agree");
  }
  const auto decays = mx::exp(mx::multiply(mx::expand_dims(dt, -1), a));  // (B, T, D, N)
  const auto inputs = mx::multiply(mx::expand_dims(mx::multiply(dt, x), -1), mx::expand_dims(b, 2));
  std::vector<mx::array> states;
  states.reserve(steps);
  for (int t = 0; t < steps; ++t) {
    const auto step = [t](const mx::array& all) { return mx::take(all, t, 1); };
    state = mx::add(mx::multiply(step(decays), state), step(inputs));
    states.push_back(state);
  }
  auto output = mx::sum(mx::multiply(mx::stack(states, 1), mx::expand_dims(c, 2)), -1);
  return {std::move(output), std::move(state)};
}

// Both results, made once per call for the output node and the state node of the same
// operands.
mx::array selective_scan_node(const etmlx_ir::SelectiveScan& op, Env& env) {
  const std::vector<const etmlx_ir::Tid*> refs = {op.x(), op.dt(), op.a(), op.b(), op.c(), op.state()};
  std::vector<int64_t> key = {-static_cast<int64_t>(etmlx_ir::Op::SelectiveScan)};
  for (const auto* ref : refs) {
    key.push_back(ref->idx());
  }
  const auto& results = env.shared(key, [&] {
    return selective_scan(env.t(op.x()), env.t(op.dt()), env.t(op.a()), env.t(op.b()), env.t(op.c()),
                          env.t(op.state()));
  });
  return results[op.final_state() ? 1 : 0];
}

}  // namespace

void register_state_space(Registry& r) { r.tensor<etmlx_ir::SelectiveScan, selective_scan_node>(); }

}  // namespace etmlx::native
