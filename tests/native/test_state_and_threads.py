"""State held by the native backend: buffers across calls, two loads apart, a failed
call changing nothing; and calls from several threads on one loaded program."""

import threading

import pytest
import runtimes
import torch

import etmlx
from etmlx.runtime_shim.errors import InputError
from lowering_harness import lower


class Counter(torch.nn.Module):
    """Counts its calls in a buffer and adds the count to its input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1)
        return x + self.calls


@pytest.fixture(scope="module")
def counter() -> bytes:
    lowered = lower(Counter(), (torch.zeros(3),))
    assert lowered.kernels == [] and lowered.delegates[0]["buffers"]
    return lowered.pte


def test_buffer_counts_calls_and_loads_are_apart(counter):
    first, second = runtimes.load(counter), runtimes.load(counter)
    for expected in (1.0, 2.0, 3.0):
        assert torch.equal(first.forward(torch.zeros(3)), torch.full((3,), expected))
    assert torch.equal(second.forward(torch.zeros(3)), torch.ones(3))


def test_a_failed_call_leaves_the_buffers_as_they_were(counter):
    program = runtimes.load(counter)
    program.forward(torch.zeros(3))
    with pytest.raises(InputError):
        program.forward(torch.zeros(4))
    assert torch.equal(program.forward(torch.zeros(3)), torch.full((3,), 2.0))


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_calls_from_several_threads(runtime):
    from examples import models

    module, inputs, _ = models.encoder_block()
    pte = lower(module, inputs).pte
    program = etmlx.load(pte, runtime=runtime)
    batches = [torch.randint(0, 256, inputs[0].shape) for _ in range(4)]
    expected = [program.forward(tokens) for tokens in batches]
    failures = []

    def worker(index):
        try:
            for _ in range(10):
                torch.testing.assert_close(program.forward(batches[index]), expected[index], rtol=0, atol=0)
        except Exception as error:  # reported below, with the thread's index
            failures.append((index, error))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
