"""Vision-language families that share a tested family's methods, each exported from a
tiny random folder and run on both runtimes against transformers: Qwen2-VL, whose rows and
positions go as Qwen2.5-VL's (tests/multimodal/test_qwen2_5_vl.py) and whose vision
transformer attends over the whole image. ``make test-vision`` runs this sweep."""

import os

import etmlx
from etmlx.multimodal.images import load_processor
from examples import vision_language
from vision_prompts import eager, image_turn


def test_qwen2_vl_image_turns_give_transformers_greedy_tokens(tmp_path):
    from transformers import Qwen2VLForConditionalGeneration

    folder = vision_language.tiny_qwen2_5_vl_checkpoint(tmp_path / "checkpoint", family="Qwen2VL")
    image = vision_language.write_image(tmp_path / "image.png")
    pte = str(tmp_path / "exported" / "qwen2_vl.pte")
    assert etmlx.export_llm(folder, pte, max_seq_len=24, max_context=96, image_size=(32, 24)).report.fully_delegated
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder).eval()
    expected = eager(model, load_processor(os.path.dirname(pte)), "what is in it?", image)
    assert len(set(expected)) > 3
    for runtime in etmlx.RUNTIMES:
        assert image_turn(etmlx.load(pte, runtime=runtime), pte, "what is in it?", image) == expected
