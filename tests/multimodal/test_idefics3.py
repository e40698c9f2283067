"""A vision-language model whose processor splits an image into tiles (Idefics3, the
architecture of SmolVLM): one export of a tiny random folder, its vision encoder run once
per tile, image turns on both runtimes and in ExecuTorch's MultimodalRunner against
transformers' ``generate``."""

import os

import pytest
import torch

import etmlx
import runtimes
from etmlx.llm.generation import GenerationError
from etmlx.multimodal.images import image_prompt, image_rows, runner_inputs
from examples import vision_language
from vision_prompts import eager, image_turn, runner_and_eager_text


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    """(.pte, export result, eager model, processor)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = vision_language.tiny_idefics3_checkpoint(tmp_path_factory.mktemp("idefics3") / "checkpoint")
    pte = os.path.join(tmp_path_factory.mktemp("exported"), "idefics3.pte")
    result = etmlx.export_llm(folder, pte, max_seq_len=32, max_context=160)  # prompts of ~60: chunked
    return pte, result, AutoModelForImageTextToText.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def test_the_vision_encoder_takes_one_tile_whole_on_mlx(idefics3):
    from etmlx.inspection import inspect_program

    pte, result, _, _ = idefics3
    assert result.report.fully_delegated
    methods = inspect_program(pte)["methods"]
    encoder = methods["vision_encoder"]
    assert len(encoder["delegates"]) == 1 and not encoder["kernels"]
    assert {"Conv", "Sdpa", "LayerNorm"} <= set(encoder["delegates"][0]["nodes"])
    features = etmlx.load(pte).run_method("vision_encoder", [torch.zeros(1, 3, 32, 32)])[0]
    assert tuple(features.shape) == (1, 4, 64)  # 16 patches, shuffled by 2 into 4 rows of the text model's width


@pytest.mark.parametrize("size", [(40, 52), (70, 20)])  # 2 x 2 tiles and the whole; 2 x 1 and the whole
def test_an_image_of_tiles_gives_transformers_greedy_tokens(idefics3, tmp_path, size):
    pte, _, model, processor = idefics3
    image = vision_language.write_image(tmp_path / "image.png", seed=size[0], size=size)
    assert len(image_prompt(os.path.dirname(pte), "what is in it?", image)[1]) == {(40, 52): 5, (70, 20): 3}[size]
    tokens = image_turn(runtimes.load(pte), pte, "what is in it?", image)
    assert tokens == eager(model, processor, "what is in it?", image) and len(set(tokens)) > 3


def test_executorch_multimodal_runner_takes_the_tiles_in_order(idefics3, tmp_path):
    """ExecuTorch's C++ MultimodalRunner (its Python binding) encodes each tile and fills
    its placeholders, from ``runner_inputs``."""
    pte, _, model, processor = idefics3
    image = vision_language.write_image(tmp_path / "image.png", seed=3)
    runner_text, eager_text = runner_and_eager_text(pte, model, processor, "and this?", image)
    assert runner_text == eager_text


def test_placeholders_that_do_not_match_the_tiles_are_one_error(idefics3):
    pte, _, model, _ = idefics3
    image = model.config.image_token_id
    with pytest.raises(GenerationError, match="2 runs of image tokens .* for 3 images or tiles"):
        runner_inputs([1, image, image, 2, image, image, 3], torch.zeros(3, 3, 32, 32), image)


def test_a_padded_tile_is_refused():
    """The exported encoder computes full tiles; a processor that padded one (several
    images of other sizes in one batch) is refused rather than encoded as if full."""
    mask = torch.ones(1, 2, 32, 32, dtype=torch.long)
    mask[0, 1, :, 20:] = 0
    with pytest.raises(GenerationError, match="padded a tile"):
        image_rows({"pixel_values": torch.rand(1, 2, 3, 32, 32), "pixel_attention_mask": mask})
    padding = torch.ones(1, 3, 32, 32, dtype=torch.long)
    padding[0, 2] = 0  # a batch's padding tile: no image, dropped
    assert image_rows({"pixel_values": torch.rand(1, 3, 3, 32, 32), "pixel_attention_mask": padding}).shape[0] == 2


def test_smolvlm_exports_as_idefics3_does(tmp_path):
    """SmolVLM's classes (Idefics3's architecture under another model type), with
    Idefics3's processor: SmolVLM's own needs num2words and a torchvision built for the
    installed torch, which the test environment does not install."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = vision_language.tiny_idefics3_checkpoint(tmp_path / "smolvlm", seed=1, family="SmolVLM")
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    assert model.config.model_type == "smolvlm"
    pte = str(tmp_path / "smolvlm.pte")
    assert etmlx.export_llm(folder, pte, max_seq_len=32, max_context=160).report.fully_delegated
    image = vision_language.write_image(tmp_path / "image.png", seed=5)
    tokens = image_turn(etmlx.load(pte, runtime="executorch"), pte, "what is it?", image)
    assert tokens == eager(model, AutoProcessor.from_pretrained(folder), "what is it?", image)
