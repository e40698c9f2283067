// AllSum: mx::distributed::all_sum over the global process group (tensor
// parallelism). The group is the one the embedding process initialized
// (etmlx.load calls mx.distributed.init in this process, on the same libmlx); a
// group of one returns x.
#include <mlx/distributed/ops.h>

#include "registry.h"

namespace etmlx::native {

namespace {

mx::array all_sum(const etmlx_ir::AllSum& op, Env& env) { return mx::distributed::all_sum(env.t(op.x())); }

}  // namespace

void register_collectives(Registry& r) { r.tensor<etmlx_ir::AllSum, all_sum>(); }

}  // namespace etmlx::native
