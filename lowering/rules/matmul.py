"""Matrix products. ``linear`` reaches here as ``addmm``/``mm`` on a weight that
folding already transposed at export."""

from etmlx.serializer.generated.etmlx_ir import Addmm, Matmul

from ..registry import lowers


@lowers("aten::mm", "aten::bmm", "aten::matmul")
def _lower_matmul(ctx, node):
    a, b = node.args[:2]
    ctx.bind(node, ctx.emit(Matmul, a=ctx.tensor(a), b=ctx.tensor(b)))


@lowers("aten::addmm")
def _lower_addmm(ctx, node):
    c, a, b = node.args[:3]
    alpha, beta = float(node.kwargs.get("alpha", 1)), float(node.kwargs.get("beta", 1))
    out = ctx.emit(Addmm, c=ctx.tensor(c), a=ctx.tensor(a), b=ctx.tensor(b), alpha=alpha, beta=beta)
    ctx.bind(node, out)
