"""A vision-language model whose image tokens attend to their whole image (Gemma 3:
transformers' block mask over ``token_type_ids``, inside each sliding layer's window):
one export of a tiny random folder, its image call's logits and greedy turns on both
runtimes and in ExecuTorch's MultimodalRunner against transformers."""

import os

import pytest
import torch

import etmlx
import runtimes
from etmlx.inspection import inspect_program
from etmlx.llm.generation import Session
from etmlx.multimodal.images import PromptImages, image_prompt
from examples import vision_language
from vision_prompts import eager, image_turn, runner_and_eager_text

PROMPT = "what is in it?"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """(.pte, export result, eager model, processor, image)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = vision_language.tiny_gemma3_checkpoint(tmp_path_factory.mktemp("gemma3") / "checkpoint")
    pte = os.path.join(tmp_path_factory.mktemp("exported"), "gemma3.pte")
    result = etmlx.export_llm(folder, pte, max_seq_len=26, max_context=80)
    image = vision_language.write_image(os.path.join(folder, "image.png"))
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    return pte, result, model, AutoProcessor.from_pretrained(folder), image


def test_images_attend_both_ways_within_each(gemma3):
    """A prompt of three image turns, fed as one: its last logits equal transformers' with
    ``token_type_ids`` (an image's tokens see their whole image, not another image) and
    differ from a plainly causal call's, which the tiny model tells apart. The second image
    straddles the file's longest call (26), so ``Session`` ends that call before it; the
    second and third then share a call."""
    pte, result, model, processor, image = gemma3
    assert result.report.fully_delegated
    methods = inspect_program(pte)["methods"]
    (decoder,), (forward,) = methods["text_decoder"]["delegates"], methods["forward"]["delegates"]
    # the blocks are numbered (CumSum) and ORed into both layers' masks in MLX, each
    # attention still the fused kernel; forward, on tokens only, has no block
    assert decoder["nodes"].count("CumSum") == 1 and decoder["nodes"].count("Sdpa") == 2
    assert {"BitwiseOr", "CumSum"} <= set(decoder["nodes"]) and not {"BitwiseOr", "CumSum"} & set(forward["nodes"])
    ids, pixel_values = image_prompt(os.path.dirname(pte), PROMPT, image)
    start = ids[:15]  # a turn's start: its image at 9 to 12, then 24 to 27 and 39 to 42
    tokens, pixels = start + start + ids, torch.cat([torch.as_tensor(pixel_values)] * 3)
    inputs = {"input_ids": torch.tensor([tokens]), "pixel_values": pixels,
              "token_type_ids": (torch.tensor([tokens]) == model.config.image_token_id).long()}
    with torch.no_grad():
        blocked = model(**inputs).logits[0, -1]
        causal = model(**{**inputs, "token_type_ids": torch.zeros_like(inputs["token_type_ids"])}).logits[0, -1]
    assert (blocked - causal).abs().max() > 1e-3
    for runtime in etmlx.RUNTIMES:
        session = Session(etmlx.load(pte, runtime=runtime))
        session.images = PromptImages(session.program, pixels, tokens)
        assert [end for _, end in session._chunks(len(tokens))] == [24, 50, 69]
        torch.testing.assert_close(torch.as_tensor(session.feed(tokens)).reshape(-1), blocked, rtol=1e-4, atol=1e-4)


def test_image_turns_give_transformers_greedy_tokens(gemma3):
    pte, _, model, processor, image = gemma3
    tokens = image_turn(runtimes.load(pte), pte, PROMPT, image)
    assert tokens == eager(model, processor, PROMPT, image) and len(set(tokens)) > 3


def test_executorch_multimodal_runner_gives_transformers_text(gemma3):
    """ExecuTorch's C++ MultimodalRunner prefills the image in one call, and its rows
    carry the channel that marks them."""
    pte, _, model, processor, image = gemma3
    runner_text, eager_text = runner_and_eager_text(pte, model, processor, "and this?", image)
    assert runner_text == eager_text


def test_an_image_longer_than_the_sliding_window_is_refused(tmp_path):
    """Past its window a sliding layer's rings would not let an image's first tokens see
    its last; refused at export rather than computed otherwise."""
    import json

    folder = vision_language.tiny_gemma3_checkpoint(tmp_path / "narrow")
    with open(folder + "/config.json") as f:
        config = json.load(f)
    config["text_config"]["sliding_window"] = 2
    with open(folder + "/config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(etmlx.ExportError, match="4 tokens per image, past the sliding window of 2"):
        etmlx.export_llm(folder, tmp_path / "narrow.pte")

