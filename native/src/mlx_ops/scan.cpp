// Ops along one axis: Scan (inclusive running reductions), Sort and ArgSort.
#include <mlx/ops.h>

#include "mlx_functions.h"
#include "registry.h"

namespace etmlx::native {

namespace {

using mlx_functions::kScanOp;
static_assert(covers_enum(kScanOp), "every ScanOp needs a function, in enum order");

mx::array scan(const etmlx_ir::Scan& op, Env& env) {
  return kScanOp[static_cast<size_t>(op.op())].second(env.t(op.x()), op.axis());
}

mx::array sort(const etmlx_ir::Sort& op, Env& env) { return mx::sort(env.t(op.x()), op.axis()); }

mx::array argsort(const etmlx_ir::ArgSort& op, Env& env) { return mx::argsort(env.t(op.x()), op.axis()); }

}  // namespace

void register_scan(Registry& r) {
  r.tensor<etmlx_ir::Scan, scan>();
  r.tensor<etmlx_ir::Sort, sort>();
  r.tensor<etmlx_ir::ArgSort, argsort>();
  r.operations("Scan", enum_names(kScanOp, etmlx_ir::EnumNameScanOp));
}

}  // namespace etmlx::native
