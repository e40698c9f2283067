"""A vision-language model of positions in three dimensions (Qwen2.5-VL: multimodal RoPE,
a vision transformer attending within windows): one export of a tiny random folder at
a fixed image size, its logits over images and its greedy turns on both runtimes and in
ExecuTorch's MultimodalRunner against transformers."""

import os

import pytest
import torch

import etmlx
import runtimes
from etmlx.inspection import inspect_program
from etmlx.llm.generation import Session
from etmlx.multimodal.images import PromptImages, load_processor
from examples import vision_language
from vision_prompts import eager, image_turn, rgb, runner_and_eager_text

PROMPT = "what is in it?"
IMAGE_SIZE = (32, 32)  # 8 x 8 patches of 4 pixels, merged 2 x 2: 16 tokens an image, 4 windows of 4


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """(.pte, export result, eager model, the processor saved beside the .pte, image)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    folder = vision_language.tiny_qwen2_5_vl_checkpoint(tmp_path_factory.mktemp("qwen") / "checkpoint")
    pte = os.path.join(tmp_path_factory.mktemp("exported"), "qwen.pte")
    result = etmlx.export_llm(folder, pte, max_seq_len=24, max_context=160, image_size=IMAGE_SIZE)
    image = vision_language.write_image(os.path.join(folder, "image.png"))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    return pte, result, model, load_processor(os.path.dirname(pte)), image


def test_image_rows_take_positions_in_three_dimensions(qwen):
    """A prompt of three image turns fed as one: its last logits equal transformers' (its
    ``get_rope_index`` numbers each image's tokens by row and column, and the text after
    an image past the larger side of its grid) and differ from those of positions
    numbered one by one, which the tiny model tells apart. The file's longest call (24)
    splits the prompt before the second image and the third."""
    pte, result, model, processor, image = qwen
    assert result.report.fully_delegated
    methods = inspect_program(pte)["methods"]
    encoder, decoder, forward = (methods[name]["delegates"][0]
                                 for name in ("vision_encoder", "text_decoder", "forward"))
    # the windowed layer's four windows in one batched attention, the full layer's in one
    assert encoder["nodes"].count("Sdpa") == 2 and "Conv" in encoder["nodes"]
    assert {b["name"] for b in decoder["buffers"]} == {b["name"] for b in forward["buffers"]}  # one cache, one RoPE
    assert any("next_position" in b["name"] for b in decoder["buffers"])                       # offset for both
    inputs = processor(images=[rgb(image)] * 3, text=processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}] * 3,
        add_generation_prompt=True))
    tokens, pixels = inputs["input_ids"][0].tolist(), inputs.pop("pixel_rows")
    with torch.no_grad():
        positioned = model(**inputs).logits[0, -1]
        one_by_one = model(**inputs, position_ids=torch.arange(len(tokens))[None]).logits[0, -1]
    assert (positioned - one_by_one).abs().max() > 1e-3
    for runtime in etmlx.RUNTIMES:
        session = Session(etmlx.load(pte, runtime=runtime))
        session.images = PromptImages(session.program, pixels, tokens)
        torch.testing.assert_close(torch.as_tensor(session.feed(tokens)).reshape(-1), positioned, rtol=1e-4, atol=1e-4)


def test_image_turns_give_transformers_greedy_tokens(qwen):
    pte, _, model, processor, image = qwen
    tokens = image_turn(runtimes.load(pte), pte, PROMPT, image)
    assert tokens == eager(model, processor, PROMPT, image) and len(set(tokens)) > 3


def test_a_conversation_goes_on_from_where_the_image_left_the_positions(qwen, tmp_path):
    """Chat turns after an image turn: ``forward`` (tokens) and ``text_decoder`` read the
    RoPE offset that the image left in the file's buffer, so the second and third turns
    give transformers' text for the whole conversation (whose positions it computes
    afresh)."""
    from etmlx.llm.chat import Chat

    pte, _, model, processor, image = qwen
    other = rgb(vision_language.write_image(tmp_path / "other.png", seed=5, size=(60, 30)))
    chat = Chat(Session(runtimes.load(pte)), processor.tokenizer, max_new_tokens=8, processor=processor)
    eos = model.generation_config.eos_token_id
    for text, picture in (("first?", rgb(image)), ("and then?", None), ("second?", other)):
        reply = "".join(chat.reply(text, picture))
        so_far = processor.apply_chat_template(chat.messages[:-1], add_generation_prompt=True)
        inputs = processor(images=chat.images, text=so_far)
        inputs.pop("pixel_rows")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
        expected = [t for t in out[0, inputs["input_ids"].shape[1]:].tolist() if t != eos]
        assert reply == processor.tokenizer.decode(expected, skip_special_tokens=True)
    assert chat.fed_from > 0  # the last turn fed past the cached first ones


def test_executorch_multimodal_runner_gives_transformers_text(qwen):
    """ExecuTorch's C++ MultimodalRunner takes the image as [1, 3, H, W] pixels; the
    encoder cuts its patches as the processor does, and its rows carry their places."""
    pte, _, model, processor, image = qwen
    runner_text, eager_text = runner_and_eager_text(pte, model, processor, "and this?", image)
    assert runner_text == eager_text


@pytest.mark.parametrize("size, last", [((24, 40), [0, 2, 4, 5]), ((32, 24), [0, 3, 2, 4])])
def test_windows_cut_short_at_the_edges_match_transformers(qwen, size, last):
    """Images whose grids the windows do not divide (3 x 5 and 4 x 3 merged patches,
    windows of 2 x 2: padded to full windows, which the mask leaves out): the file's one
    vision_encoder gives transformers' features for the processor's patches of each, on
    both runtimes, its last row placed at (0, row, column) and advancing the larger side."""
    from etmlx.multimodal.qwen_processor import QwenVLProcessor

    pte, _, model, _, image = qwen
    inputs = QwenVLProcessor(os.path.dirname(pte), image_size=size)(images=[rgb(image)], text="<|image_pad|>")
    with torch.no_grad():
        expected = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output[0]
    pixels = inputs["pixel_rows"][0][None]
    for runtime in etmlx.RUNTIMES:
        rows = torch.as_tensor(etmlx.load(pte, runtime=runtime).run_method("vision_encoder", [pixels])[0])
        torch.testing.assert_close(rows[0, :, :-4], expected, rtol=1e-4, atol=1e-5)
        assert rows[0, -1, -4:].tolist() == last


def test_an_image_longer_than_the_encoder_takes_is_refused(qwen, tmp_path):
    """The encoder's sides are bounded (ExecuTorch plans its input and output at the
    largest of both): an image the processor makes longer than that, one error."""
    import shutil

    from PIL import Image

    from etmlx.llm.generation import GenerationError
    from etmlx.multimodal.qwen_processor import write_max_pixels

    pte = qwen[0]
    shutil.copytree(os.path.dirname(pte), tmp_path, ignore=shutil.ignore_patterns("*.pte"), dirs_exist_ok=True)
    write_max_pixels(tmp_path, (64, 64))  # 64 merged patches of 8 x 8 pixels: 32 a side at most
    with pytest.raises(GenerationError, match="makes it 1 x 90 merged patches, and the export takes at most 32 a side"):
        load_processor(tmp_path)(images=[Image.new("RGB", (1024, 8))], text="<|image_pad|>")


TINY = {"patch_size": 4, "merge_size": 2, "size": {"shortest_edge": 256, "longest_edge": 1024}}
HUB = {"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}  # Qwen2.5-VL's on the Hub


@pytest.mark.parametrize("config, size, message", [
    (TINY, (30, 32), "each side must be a positive multiple of 8 pixels"),
    (TINY, 8, "64 pixels, outside the processor's 256 to 1024"),
    (HUB, 28, "784 pixels, outside the processor's 3136 to 12845056"),
])
def test_image_sizes_the_model_cannot_take_are_refused(config, size, message):
    from etmlx.multimodal import qwen_processor

    with pytest.raises(etmlx.ExportError, match=message):
        qwen_processor.image_size(config, size)


def test_the_default_size_is_448_within_the_processor_s_bounds():
    from etmlx.multimodal import qwen_processor

    assert qwen_processor.image_size(HUB) == (448, 448) and qwen_processor.image_size(TINY) == (32, 32)


def test_a_folder_no_export_wrote_names_what_it_lacks(qwen):
    """The checkpoint's own folder holds no export's image size: one error, not a traceback."""
    from etmlx.llm.generation import GenerationError

    _, _, _, _, image = qwen
    with pytest.raises(GenerationError, match="names no etmlx_max_pixels, the most pixels of the images the .pte"):
        load_processor(os.path.dirname(image))
