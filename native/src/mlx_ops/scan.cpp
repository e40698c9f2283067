// Ops along one axis: Scan (inclusive running reductions), Sort and ArgSort.
#include <array>
#include <utility>

#include <mlx/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

using etmlx_ir::ScanOp;
using ScanFn = mx::array (*)(const mx::array&, int);

constexpr std::array<std::pair<ScanOp, ScanFn>, 1> kScan = {{
    {ScanOp::CumSum, [](const mx::array& x, int axis) { return mx::cumsum(x, axis); }},
}};
static_assert(covers_enum(kScan), "every ScanOp needs a handler, in enum order");

mx::array scan(const etmlx_ir::Scan& op, Env& env) {
  return kScan[static_cast<size_t>(op.op())].second(env.t(op.x()), op.axis());
}

mx::array sort(const etmlx_ir::Sort& op, Env& env) { return mx::sort(env.t(op.x()), op.axis()); }

mx::array argsort(const etmlx_ir::ArgSort& op, Env& env) { return mx::argsort(env.t(op.x()), op.axis()); }

}  // namespace

void register_scan(Registry& r) {
  r.tensor<etmlx_ir::Scan, scan>();
  r.tensor<etmlx_ir::Sort, sort>();
  r.tensor<etmlx_ir::ArgSort, argsort>();
  r.operations("Scan", enum_names(kScan, etmlx_ir::EnumNameScanOp));
}

}  // namespace etmlx::native
