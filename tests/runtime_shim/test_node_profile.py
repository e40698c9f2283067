"""node_profile: time per IR operation of a call, node by node, handlers restored."""

import torch

from etmlx.runtime_shim import mlx_ops
from etmlx.runtime_shim.mlx_ops import cpu_math
from etmlx.runtime_shim.node_profile import node_seconds
from lowering_harness import lower


def test_seconds_per_operation_then_the_handlers_back():
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GELU(), torch.nn.Flatten(), torch.nn.Linear(8 * 36, 4))
    x = torch.randn(1, 3, 8, 8)
    handlers, forms = dict(mlx_ops.HANDLERS), dict(cpu_math.UNARY_OP)
    seconds = node_seconds(lower(module.eval(), (x,)).pte, [x])
    assert {"Conv", "Unary.GeluErf", "Addmm"} <= set(seconds) and all(s > 0 for s in seconds.values())
    assert mlx_ops.HANDLERS == handlers and cpu_math.UNARY_OP == forms
