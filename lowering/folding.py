"""Export-time evaluation of layout ops on constants: a scalar constant's dtype
conversion, a weight's reshape. Only ops that move, relabel or convert data are folded
(the same conversion PyTorch would do at run time): folding an ``expand`` or arithmetic
could grow the file or change rounding.

Two transposes of a constant are not folded; each stays a Transpose node, a view of the
one stored constant that MLX reads in place:
- a linear layer's, ``addmm(bias, x, permute_copy(W))``: W is stored as the checkpoint
  holds it, (out, in), and MLX's matmul reads it transposed, as mlx-lm's ``nn.Linear``
  does: Metal's kernels are tuned for that layout, the export holds no transposed copy,
  and on the CPU the runtimes take a decode step's one-row product as ``W @ x`` over the
  stored rows, BLAS's fastest form (docs/architecture.md, "MLX traps");
- a transpose of a constant that other nodes also read (a head tied to the embedding
  table), instead of a second copy.
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
# Matrix products, by the position of their right-hand operand.
RIGHT_OPERAND = {"aten::mm": 1, "aten::matmul": 1, "aten::addmm": 2}


def fold_constant(ctx: LoweringContext, node: fx.Node) -> bool:
    """Evaluates ``node`` at export when it is a layout op on a constant."""
    if op_name(node.target) not in FOLDABLE:
        return False
    inputs = node.all_input_nodes
    if not inputs or not all(ctx.is_constant(arg) for arg in inputs):
        return False
    if op_name(node.target) in TRANSPOSES and (
            any(user is not node for user in inputs[0].users) or _read_as_transposed_matrix(node)):
        return False
    evaluate_at_export(ctx, node)
    return True


def _read_as_transposed_matrix(node: fx.Node) -> bool:
    """``node`` transposes a 2-D constant that only matrix products read, each as its
    right-hand operand alone."""
    if getattr(node.all_input_nodes[0].meta.get("val"), "ndim", None) != 2 or not node.users:
        return False
    for user in node.users:
        position = RIGHT_OPERAND.get(op_name(user.target))
        if position is None or [i for i, arg in enumerate(user.args) if arg is node] != [position]:
            return False
    return True


def evaluate_at_export(ctx: LoweringContext, node: fx.Node) -> None:
    """``node``'s value, computed by PyTorch from its constant inputs, as a constant."""
    args = fx.node.map_arg(node.args, lambda arg: ctx.constant_values[arg])
    kwargs = fx.node.map_arg(node.kwargs, lambda arg: ctx.constant_values[arg])
    with torch.no_grad():
        ctx.constant_values[node] = node.target(*args, **kwargs).contiguous()
