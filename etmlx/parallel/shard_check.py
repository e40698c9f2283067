"""Checks a sharding before it is written: the ranks' traced programs, run together in
eager PyTorch as threads of this process (their ``etmlx::all_sum`` adding the ranks'
values), must compute what the whole model's program computes on its example inputs.
A layout the structural reading of ``etmlx/parallel/shard_plan.py`` got wrong is then one
``ExportError``, never a program that computes something else."""

import math
import threading

import torch

from etmlx.errors import ExportError
from etmlx.lowering.custom_ops import ALL_SUM_GROUP

TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}  # of the largest output value


class _ThreadGroup:
    """``size`` threads that sum each rank's value, call by call."""

    def __init__(self, size: int):
        self.values = [None] * size
        self.barrier = threading.Barrier(size, timeout=600)
        self.rank = threading.local()

    def sum(self, x):
        self.values[self.rank.value] = x
        self.barrier.wait()
        total = sum(self.values[1:], self.values[0].clone())
        self.barrier.wait()  # every rank has read the values before the next call writes
        return total


def _runnable(program) -> torch.nn.Module:
    """``program`` as a module whose buffers are copies: running it leaves the program's
    state (a KV cache's initial value) as it was."""
    module = program.module()
    for name, buffer in list(module.named_buffers()):
        owner, _, attribute = name.rpartition(".")
        (module.get_submodule(owner) if owner else module).register_buffer(attribute, buffer.clone())
    return module


def _run(program):
    args, kwargs = program.example_inputs
    with torch.no_grad():
        return torch.utils._pytree.tree_leaves(_runnable(program)(*args, **kwargs))


def run_ranks(programs: list) -> list:
    """Each rank's outputs (flattened), the ranks run together; raises what a rank raised."""
    group = _ThreadGroup(len(programs))
    outputs, errors = [None] * len(programs), []

    def rank_main(rank):
        ALL_SUM_GROUP.group, group.rank.value = group, rank
        try:
            outputs[rank] = _run(programs[rank])
        except BaseException as error:  # noqa: BLE001  (handed to the caller)
            errors.append(error)
            group.barrier.abort()  # the other ranks stop waiting for this one
        finally:
            ALL_SUM_GROUP.group = None

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(len(programs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return outputs


def check_ranks(whole, ranks: list, method: str) -> None:
    """Every rank's outputs of ``method`` equal the whole program's, within float rounding."""
    expected = _run(whole)
    for rank, outputs in enumerate(run_ranks(ranks)):
        for index, (got, want) in enumerate(zip(outputs, expected)):
            difference, bound = _difference(got, want)
            if not difference <= bound:
                raise ExportError(
                    f"the sharded programs do not compute the model's {method!r}: rank {rank}'s output {index} differs by "
                    f"{difference:.3g} (at most {bound:.3g} expected); a block was found whose weights are not laid out "
                    "as its heads or hidden units: export without tensor_parallel=, or report the model"
                )


def _difference(got, want) -> tuple:
    """(largest difference, the bound it must stay within): relative to the largest value
    for floating outputs, exact for the rest."""
    if isinstance(want, torch.Tensor) and want.is_floating_point():
        if not want.numel():
            return 0.0, 0.0
        scale = max(1.0, float(want.double().abs().max()))
        return float((got.double() - want.double()).abs().max()), TOLERANCE.get(want.dtype, 1e-4) * scale
    same = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
    return (0.0 if same else math.inf), 0.0
