"""Vision-language families that share a tested family's methods, each exported from a
tiny random folder and run on both runtimes against transformers: Qwen2-VL, whose rows and
positions go as Qwen2.5-VL's (tests/multimodal/test_qwen2_5_vl.py) and whose vision
transformer attends over the whole image; Qwen3-VL, whose rows also carry the features of
early vision layers into early text layers (deepstack), and its mixture-of-experts form.
``make test-vision`` runs this sweep."""

import contextlib
import os

import pytest
import torch

import etmlx
from etmlx.inspection import inspect_program
from etmlx.llm.generation import Session
from etmlx.multimodal.images import PromptImages, load_processor
from examples import vision_language
from vision_prompts import eager, image_turn, rgb, runner_and_eager_text


@pytest.mark.parametrize("family", ["Qwen2VL", "Qwen3VLMoe"])
def test_image_turns_give_transformers_greedy_tokens(family, tmp_path):
    from transformers import AutoModelForImageTextToText

    folder = vision_language.tiny_qwen2_5_vl_checkpoint(tmp_path / "checkpoint", family=family)
    image = vision_language.write_image(tmp_path / "image.png")
    pte = str(tmp_path / "exported" / "qwen.pte")
    assert etmlx.export_llm(folder, pte, max_seq_len=24, max_context=96, image_size=(32, 24)).report.fully_delegated
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    expected = eager(model, load_processor(os.path.dirname(pte)), "what is in it?", image)
    assert len(set(expected)) > 3
    for runtime in etmlx.RUNTIMES:
        assert image_turn(etmlx.load(pte, runtime=runtime), pte, "what is in it?", image) == expected


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory):
    """(.pte, eager model, the processor saved beside the .pte, image) of a Qwen3-VL of two
    deepstack layers, exported at a size that is not square."""
    from transformers import Qwen3VLForConditionalGeneration

    folder = vision_language.tiny_qwen2_5_vl_checkpoint(tmp_path_factory.mktemp("qwen3") / "checkpoint",
                                                        family="Qwen3VL")
    pte = os.path.join(tmp_path_factory.mktemp("exported"), "qwen3_vl.pte")
    assert etmlx.export_llm(folder, pte, max_seq_len=24, max_context=160, image_size=(32, 24)).report.fully_delegated
    image = vision_language.write_image(os.path.join(folder, "image.png"))
    model = Qwen3VLForConditionalGeneration.from_pretrained(folder).eval()
    return pte, model, load_processor(os.path.dirname(pte)), image


def test_qwen3_vl_deepstack_rows_give_transformers_logits(qwen3_vl, tmp_path):
    """Two image turns fed as one (the file's longest call, 24, splits them), each image at
    its own size (the processor keeps its shape, within the export's pixels): the last
    logits equal transformers' on both runtimes, and differ from transformers' with the
    deepstack features left out, which the tiny model tells apart: every image row
    carries its two deepstack vectors (a token's are zeros) beside its embedding."""
    pte, model, processor, image = qwen3_vl
    hidden = model.config.text_config.hidden_size
    methods = inspect_program(pte)["methods"]
    encoder, decoder, forward = (methods[name]["delegates"] for name in ("vision_encoder", "text_decoder", "forward"))
    # one delegate each: the tower's two layers attend over the whole image in one fused attention each
    assert len(encoder) == len(decoder) == 1 and encoder[0]["nodes"].count("Sdpa") == 2
    assert {b["name"] for b in decoder[0]["buffers"]} == {b["name"] for b in forward[0]["buffers"]}  # one cache
    wide = vision_language.write_image(tmp_path / "wide.png", seed=3, size=(20, 64))
    inputs = processor(images=[rgb(image), rgb(wide)], text=processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is in it?"}]}] * 2,
        add_generation_prompt=True))
    tokens, pixels = inputs["input_ids"][0].tolist(), inputs.pop("pixel_rows")
    assert pixels[0].shape != pixels[1].shape  # (24 x 24 and 8 x 48 pixels)
    with torch.no_grad():
        expected = model(**inputs).logits[0, -1]
        with _without_deepstack(model.model.language_model):
            without = model(**inputs).logits[0, -1]
    assert (expected - without).abs().max() > 1e-3
    for runtime in etmlx.RUNTIMES:
        program = etmlx.load(pte, runtime=runtime)
        rows = torch.as_tensor(program.run_method("vision_encoder", [pixels[0][None]])[0])
        assert rows.shape[-1] == 3 * hidden + 4  # the embedding, two deepstack vectors, the placement
        session = Session(program)
        session.images = PromptImages(program, pixels, tokens)
        torch.testing.assert_close(torch.as_tensor(session.feed(tokens)).reshape(-1), expected, rtol=1e-4, atol=1e-4)


def test_qwen3_vl_image_turns_give_transformers_text(qwen3_vl):
    """Greedy tokens on both runtimes, and ExecuTorch's MultimodalRunner's text."""
    pte, model, processor, image = qwen3_vl
    expected = eager(model, processor, "what is in it?", image)
    assert len(set(expected)) > 3
    for runtime in etmlx.RUNTIMES:
        assert image_turn(etmlx.load(pte, runtime=runtime), pte, "what is in it?", image) == expected
    runner_text, eager_text = runner_and_eager_text(pte, model, processor, "and this?", image)
    assert runner_text == eager_text


@contextlib.contextmanager
def _without_deepstack(text_model):
    text_model._deepstack_process = lambda hidden, mask, vectors: hidden
    try:
        yield
    finally:
        del text_model._deepstack_process
