"""Export-time evaluation of layout ops on constants.

A linear layer reaches the edge graph as ``addmm(bias, x, permute_copy(W))``;
evaluating the permute here stores W already transposed, so MLX never transposes
a weight at run time. Likewise a scalar constant's dtype conversion. Only ops that
move, relabel or convert data are folded (the same conversion PyTorch would do at
run time): folding an ``expand`` or arithmetic could grow the file or change rounding.
A transpose of a constant that other nodes also read (a head tied to the embedding
table) is not folded: it stays a Transpose node, a view of the one stored constant that
MLX's matmul reads as transposed, as mlx-lm's ``as_linear`` does, instead of a second copy.
"""

import torch
from torch import fx

from .context import LoweringContext
from .registry import op_name

FOLDABLE = {
    "aten::permute_copy",
    "aten::t_copy",
    "aten::transpose_copy.int",
    "aten::view_copy",
    "aten::squeeze_copy.dims",
    "aten::squeeze_copy.dim",
    "aten::unsqueeze_copy",
    "aten::clone",
    "dim_order_ops::_clone_dim_order",
    "aten::_to_copy",
    "dim_order_ops::_to_dim_order_copy",
}
TRANSPOSES = {"aten::permute_copy", "aten::t_copy", "aten::transpose_copy.int"}


def fold_constant(ctx: LoweringContext, node: fx.Node) -> bool:
    """Evaluates ``node`` at export when it is a layout op on a constant."""
    if op_name(node.target) not in FOLDABLE:
        return False
    inputs = node.all_input_nodes
    if not inputs or not all(ctx.is_constant(arg) for arg in inputs):
        return False
    if op_name(node.target) in TRANSPOSES and any(user is not node for user in inputs[0].users):
        return False
    evaluate_at_export(ctx, node)
    return True


def evaluate_at_export(ctx: LoweringContext, node: fx.Node) -> None:
    """``node``'s value, computed by PyTorch from its constant inputs, as a constant."""
    args = fx.node.map_arg(node.args, lambda arg: ctx.constant_values[arg])
    kwargs = fx.node.map_arg(node.kwargs, lambda arg: ctx.constant_values[arg])
    with torch.no_grad():
        ctx.constant_values[node] = node.target(*args, **kwargs).contiguous()
