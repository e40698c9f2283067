"""Running reductions along an axis."""

from etmlx.serializer.generated.etmlx_ir import Scan
from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp

from ..registry import lowers
from .common import as_dtype, normalize_axis, out_dtype, rank_of


@lowers("aten::cumsum")
def _lower_cumsum(ctx, node, args):
    """(cumprod, cummax and cummin are not core ATen: they never reach lowering.)"""
    x, dim = args.self, args.dim
    # PyTorch accumulates integers and booleans in int64 (or the requested dtype).
    operand = as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Scan, op=ScanOp.CumSum, x=operand, axis=normalize_axis(dim, rank_of(x))))
