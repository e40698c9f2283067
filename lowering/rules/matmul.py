"""Matrix products. ``linear`` reaches here as ``addmm``/``mm`` on a weight that
folding already transposed at export."""

from etmlx.serializer.generated.etmlx_ir import Addmm, Matmul

from ..dtypes import check_floating
from ..registry import lowers
from .common import out_dtype


def _check_floating(node, args):
    return check_floating(out_dtype(node), "matrices")


@lowers("aten::mm", "aten::bmm", "aten::matmul", check=_check_floating)
def _lower_matmul(ctx, node, args):
    other = args.get("mat2", args.get("other"))  # matmul names it ``other``
    ctx.bind(node, ctx.emit(Matmul, a=ctx.tensor(args.self), b=ctx.tensor(other)))


@lowers("aten::addmm", check=_check_floating)
def _lower_addmm(ctx, node, args):
    """``beta * self + alpha * (mat1 @ mat2)``."""
    out = ctx.emit(
        Addmm, c=ctx.tensor(args.self), a=ctx.tensor(args.mat1), b=ctx.tensor(args.mat2),
        alpha=float(args.alpha), beta=float(args.beta),
    )
    ctx.bind(node, out)
