"""Whisper decoding with the self-attention cache inside the MLX delegate."""

import pytest
import runtimes
import torch

import etmlx
from examples import hf_models, whisper

PROMPT = [1, 7, 30]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = hf_models._whisper()
    torch.manual_seed(1)
    with torch.no_grad():
        states = hf_models.WhisperEncoder(model)(torch.randn(1, 16, 64))
    path = tmp_path_factory.mktemp("whisper") / "whisper_decoder.pte"
    result = etmlx.export_methods(whisper.export_methods(model, states), path)
    return model, states, path, result


def test_whole_on_mlx(exported):
    from etmlx.inspection import inspect_program

    *_, path, result = exported
    assert result.report.fully_delegated
    for method in inspect_program(path)["methods"].values():
        (delegate,) = method["delegates"]
        assert method["kernels"] == [] and len(delegate["buffers"]) == 4
        assert delegate["nodes"].count("Sdpa") == 4  # self- and cross-attention, two layers


def test_each_step_matches_the_hugging_face_model(exported):
    model, states, path, _ = exported
    program = runtimes.load(path)
    tokens = list(PROMPT)
    logits = program.prefill(torch.tensor([tokens]), states, torch.arange(len(tokens)))
    for _ in range(6):
        with torch.no_grad():
            eager = model(decoder_input_ids=torch.tensor([tokens]), encoder_outputs=(states,)).logits
        torch.testing.assert_close(logits[0, -1], eager[0, -1], rtol=1e-4, atol=1e-4)
        tokens.append(int(eager[0, -1].argmax()))
        logits = program.decode(torch.tensor([[tokens[-1]]]), states, torch.tensor([len(tokens) - 1]))


def test_greedy_tokens_equal_eager(exported):
    model, states, path, _ = exported
    assert whisper.greedy(runtimes.load(path), PROMPT, states, 8) == whisper.eager_greedy(model, PROMPT, states, 8)
