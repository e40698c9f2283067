"""Mixture-of-experts causal LMs through ``etmlx.llm.causal_lm``: the router's top-k and the
experts' matmuls (``mx.gather_mm``) run on MLX with the rest, prefill and decode, and
compute eager PyTorch's logits (eager runs transformers' default ``grouped_mm`` experts)."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.inspection import inspect_program
from etmlx.quant.weights import quantized_copy
from examples import llm

CAPACITY = 512
LAYERS = 2
PROMPT = [5, 17, 42, 8, 99, 3]
EXPERTS = {
    "Mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    # shared expert with its own gate; top-k weights not renormalized
    "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96, shared_expert_intermediate_size=64),
}


def _tiny_moe(family: str):
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CAPACITY, **EXPERTS[family],
    )
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    return llm.with_static_cache(model, CAPACITY)


def _eager_logits(model, tokens: list) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits


@pytest.mark.parametrize("family", EXPERTS)
def test_mixture_of_experts_runs_on_mlx_with_eager_logits(tmp_path, family):
    model = _tiny_moe(family)
    default = model.config._experts_implementation
    result = etmlx.export_methods(llm.export_methods(model), tmp_path / "moe.pte")
    assert model.config._experts_implementation == default == "grouped_mm"  # restored after export
    assert result.report.fully_delegated
    nodes = inspect_program(result.path)["methods"]["forward"]["delegates"][0]["nodes"]
    assert nodes.count("GatherMm") == 2 * LAYERS and nodes.count("ArgSort") == LAYERS
    assert "Index" not in nodes  # no expert weights gathered per token

    program = runtimes.load(result.path)
    for prompt in (PROMPT, [7, 3] * 10):  # the prompt length is dynamic
        logits = program.forward(torch.tensor([prompt]), torch.arange(len(prompt)))
        torch.testing.assert_close(logits, _eager_logits(model, prompt)[:, -1], rtol=0, atol=1e-4)
    program.forward(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))
    tokens = PROMPT + [77]  # one decode step, over the cache the prefill filled
    step = program.forward(torch.tensor([[tokens[-1]]]), torch.tensor([len(PROMPT)]))
    torch.testing.assert_close(step[0], _eager_logits(model, tokens)[0, -1], rtol=0, atol=1e-4)
    assert llm.greedy(program, PROMPT, 12) == llm.eager_greedy(model, PROMPT, 12)


def test_quantized_experts_run_on_gather_qmm(tmp_path):
    """``quantized_copy`` quantizes the expert stacks too (int4, groups of 32): each
    expert matmul is one GatherQmm over the packed stack, computing what the quantized
    model computes in eager PyTorch."""
    model = _tiny_moe("Mixtral")
    quantized, names = quantized_copy(model, "int4", 32)
    assert sum(".experts." in name for name in names) == 2 * LAYERS
    result = etmlx.export_methods(llm.export_methods(quantized), tmp_path / "int4.pte")
    assert result.report.fully_delegated
    report = inspect_program(result.path)
    nodes = report["methods"]["forward"]["delegates"][0]["nodes"]
    assert nodes.count("GatherQmm") == 2 * LAYERS and "GatherMm" not in nodes
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(report["named_data"].values()) < float_bytes / 3

    program = runtimes.load(result.path)
    logits = program.forward(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))
    torch.testing.assert_close(logits, _eager_logits(quantized, PROMPT)[:, -1], rtol=0, atol=1e-4)
    assert llm.greedy(program, PROMPT, 12) == llm.eager_greedy(quantized, PROMPT, 12)


def test_plain_export_of_a_mixture_of_experts_takes_the_batched_form(tmp_path):
    """``etmlx.export`` of a Mixtral's forward without a cache (was: "aten.histc is not in
    Core ATen") runs its experts on GatherMm, with eager's logits, and restores the model's setting."""
    from examples.hf_models import Logits

    model = _tiny_moe("Mixtral")
    tokens = torch.tensor([PROMPT])
    result = etmlx.export(Logits(model), (tokens,), tmp_path / "moe.pte")
    assert result.report.fully_delegated and model.config._experts_implementation == "grouped_mm"
    assert inspect_program(result.path)["methods"]["forward"]["delegates"][0]["nodes"].count("GatherMm") == 2 * LAYERS
    torch.testing.assert_close(runtimes.load(result.path).forward(tokens), _eager_logits(model, PROMPT), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attention_probe_of_experts_runs_on_fake_tensors(dtype, monkeypatch):
    """The export's probe step (``etmlx.llm.attention_probe``) runs the experts in the
    traced form: transformers' default ``grouped_mm`` takes bfloat16 only on fake tensors,
    so a float32 model's fake step failed, logged torch's traceback, and the step ran over
    the weights instead."""
    from torch._guards import active_fake_mode

    from etmlx.llm import attention_probe

    step = attention_probe._run

    def fake_only(model):
        assert active_fake_mode() is not None, "the probe ran a step over the weights"
        return step(model)

    monkeypatch.setattr(attention_probe, "_run", fake_only)
    model = _tiny_moe("Mixtral").to(dtype)
    assert attention_probe.probe(model).layer_shapes == ((2, 16, 16),) * LAYERS
