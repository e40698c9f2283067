"""Collective operations across the ranks of ``mx.distributed``'s process group
(tensor parallelism, ``etmlx/parallel/ranks.py``)."""

import mlx.core as mx


def _all_sum(op, env):
    """Over the global group, which ``etmlx.load`` joined (``mx.distributed.init``): a
    group of one, as in any process not started by ``mlx.launch``, returns x."""
    return mx.distributed.all_sum(env.t(op.x))


HANDLERS = {"AllSum": _all_sum}
