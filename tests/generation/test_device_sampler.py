"""Sampling inside the MLX delegate (``causal_lm.export_methods(sample_on_device=True)``):
the ``sample`` method draws, at the host's uniform number, the token the host sampler
draws from the same logits, on both runtimes; so a seed gives the same text either way."""

import numpy as np
import pytest
import runtimes
from lowering_harness import WINDOW_READ, tensor_kernels

import etmlx
from etmlx.llm import generation
from etmlx.inspection import inspect_program
from etmlx.runtime_shim.program import MethodCalls
from examples import llm

PROMPT = [5, 17, 3, 99, 42, 8, 1, 77, 12, 3]  # two chunks of 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = llm.tiny_llama()
    path = tmp_path_factory.mktemp("sampled") / "sampled.pte"
    etmlx.export_methods(llm.export_methods(model, 8, sample_on_device=True), path)
    return path


def test_sample_runs_whole_on_mlx_beside_forward(exported):
    methods = inspect_program(exported)["methods"]
    (delegate,) = methods["sample"]["delegates"]
    assert tensor_kernels(methods["sample"]["kernels"]) == WINDOW_READ
    assert {"ArgSort", "CumSum", "Softmax", "Sdpa"} <= set(delegate["nodes"])
    assert methods["sample"]["outputs"] == [{"kind": "tensor", "dtype": "int64", "sizes": [1], "dynamism": "static"}]


@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(temperature=1.0, top_k=5),
                                      dict(temperature=1.3, top_p=0.8), dict(temperature=1.0, min_p=0.2)])
def test_a_draw_picks_the_host_samplers_token(exported, settings):
    program = runtimes.load(exported)
    sampling = generation.Sampling(**settings)
    generation.Session(program).feed(PROMPT[:-1])  # the cache the draws continue from
    position = np.array([len(PROMPT) - 1])
    probabilities = generation.Sampler(sampling).probabilities(program.forward(np.array([PROMPT[-1:]]), position))
    order = np.argsort(-probabilities, kind="stable")
    edges = np.cumsum(probabilities[order])
    knobs = [np.array([v], dtype=t) for v, t in ((sampling.temperature, np.float32), (sampling.top_k, np.int64),
             (sampling.top_p, np.float32), (sampling.min_p, np.float32))]
    compared = 0
    for uniform in np.linspace(0.0005, 0.9995, 120):
        if np.min(np.abs(edges - uniform * edges[-1])) < 1e-4:
            continue  # float32 in the delegate, float64 here: a boundary may fall either way
        drawn = program.sample(np.array([PROMPT[-1:]]), position, *knobs, np.array([uniform], dtype=np.float32))
        assert int(drawn[0]) == generation.Sampler.draw(probabilities, uniform), uniform
        compared += 1
    assert compared > 100 and len(set(np.flatnonzero(probabilities))) > 1


class WithoutSample(MethodCalls):
    """A loaded program with its ``sample`` method hidden: a session over it samples on the
    host, from the same ``forward``."""

    def __init__(self, program):
        self.program = program
        self.method_names = [name for name in program.method_names if name != "sample"]

    def run_method(self, name, inputs):
        return self.program.run_method(name, inputs)


def test_a_seed_gives_the_host_samplers_text(exported):
    sampling = generation.Sampling(temperature=0.9, top_k=20, top_p=0.9, seed=3)
    host = generation.Session(WithoutSample(etmlx.load(exported)))
    assert not host.samples_on_device
    expected = list(generation.generate_tokens(host, PROMPT, 20, sampling, stop_at_eos=False))
    for runtime in etmlx.RUNTIMES:
        session = generation.Session(etmlx.load(exported, runtime=runtime))
        assert session.samples_on_device
        assert list(generation.generate_tokens(session, PROMPT, 20, sampling, stop_at_eos=False)) == expected
