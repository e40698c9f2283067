"""Collectives across the ranks of a tensor-parallel program (``etmlx/parallel/ranks.py``)."""

from etmlx.serializer.generated.etmlx_ir import AllSum

from ..dtypes import check_floating
from ..registry import lowers
from .common import dtype_of


def _check_all_sum(node, args):
    return check_floating(dtype_of(args.x), "sums across ranks")


@lowers("etmlx::all_sum", check=_check_all_sum)
def _lower_all_sum(ctx, node, args):
    ctx.bind(node, ctx.emit(AllSum, x=ctx.tensor(args.x)))
