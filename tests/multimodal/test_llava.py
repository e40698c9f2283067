"""A vision-language model: one export of a tiny random LLaVA folder in ExecuTorch's
multimodal convention, its image turns and text turns on both runtimes (``runtimes.load``)
against transformers' ``generate``."""

import os
import subprocess
import sys

import pytest
import torch

import etmlx
import runtimes
from etmlx.llm.generation import GenerationError, Session, generate_tokens
from etmlx.multimodal.images import PromptImages, image_prompt
from examples import vision_language
from vision_prompts import eager, image_turn, rgb

NEW_TOKENS = 10
MAX_SEQ_LEN = 16  # raised to the image's 25 tokens; a 53-token prompt's first chunk ends before the image


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """(checkpoint folder, .pte, export result, eager model, processor)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = vision_language.tiny_llava_checkpoint(tmp_path_factory.mktemp("llava") / "checkpoint")
    pte = os.path.join(tmp_path_factory.mktemp("exported"), "llava.pte")
    result = etmlx.export_llm(folder, pte, max_seq_len=MAX_SEQ_LEN, max_context=160)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    return folder, pte, result, model, AutoProcessor.from_pretrained(folder)


def test_the_multimodal_methods_are_whole_on_mlx_over_one_cache(llava):
    from etmlx.inspection import inspect_program

    _, pte, result, _, _ = llava
    assert result.report.fully_delegated
    assert Session(etmlx.load(pte)).limits["get_max_seq_len"] == 25  # the image's tokens: one runner call
    methods = inspect_program(pte)["methods"]
    for name in ("vision_encoder", "token_embedding"):
        assert len(methods[name]["delegates"]) == 1 and not methods[name]["kernels"]
    nodes = {name: set(methods[name]["delegates"][0]["nodes"]) for name in methods if methods[name]["delegates"]}
    assert {"Conv", "Sdpa", "LayerNorm", "Addmm"} <= nodes["vision_encoder"]  # CLIP: patches, attention, projector
    assert nodes["token_embedding"] == {"CheckIndex", "Take"}  # a bounds-checked row gather, nothing else
    assert {"Sdpa", "IndexPut", "Rope", "RmsNorm"} <= nodes["text_decoder"] == nodes["forward"]  # one graph on embeddings
    caches = {name: {b["name"] for b in methods[name]["delegates"][0]["buffers"]} for name in ("forward", "text_decoder")}
    assert caches["forward"] == caches["text_decoder"] and caches["forward"]  # one KV cache, shared by name


@pytest.mark.parametrize("seed", [0, 1])
def test_an_image_turn_gives_transformers_greedy_tokens(llava, tmp_path, seed):
    folder, pte, _, model, processor = llava
    image = vision_language.write_image(tmp_path / "image.png", seed=seed, size=(40 + 9 * seed, 52))
    tokens = image_turn(runtimes.load(pte), pte, "what is in it?", image)
    assert tokens == eager(model, processor, "what is in it?", image) and len(set(tokens)) > 3


def test_a_siglip_tower_at_int4_gives_the_quantized_model_s_tokens(tmp_path):
    """LLaVA on a SigLIP tower (every patch's features; a pooling head whose
    ``nn.MultiheadAttention`` reads its projection itself, which stays float), its vision
    tower, projector and Llama quantized alike at export and in eager (``quantized_copy``)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from etmlx.inspection import inspect_program
    from etmlx.quant.weights import quantized_copy

    folder = vision_language.tiny_llava_checkpoint(tmp_path / "siglip", image_size=32, patch=8, tower="siglip")
    pte = str(tmp_path / "int4.pte")
    result = etmlx.export_llm(folder, pte, max_seq_len=32, max_context=128, quantize="int4", group_size=32)
    reference, names = quantized_copy(AutoModelForImageTextToText.from_pretrained(folder).eval(), "int4", 32)
    assert result.quantized == tuple(names) and "model.vision_tower.head.attention.out_proj" not in names
    assert any(name.startswith("model.vision_tower.encoder") for name in names)
    (encoder,) = inspect_program(pte)["methods"]["vision_encoder"]["delegates"]
    # the first layer's q, k, v, out, fc1, fc2 (the features are read before the last layer), the projector's two
    assert encoder["nodes"].count("QuantizedMatmul") == 6 + 2
    image = vision_language.write_image(tmp_path / "image.png")
    expected = eager(reference, AutoProcessor.from_pretrained(folder), "what?", image)
    for runtime in etmlx.RUNTIMES:
        assert image_turn(etmlx.load(pte, runtime=runtime), pte, "what?", image) == expected


def test_executorch_multimodal_runner_gives_eager_text(llava, tmp_path):
    """ExecuTorch's own C++ MultimodalRunner (its Python binding) drives the file's methods
    with etmlx's native backend, from the processor's output."""
    import etmlx.native  # noqa: F401  (registers the backend with ExecuTorch's runtime)
    from executorch.extension.llm.runner import GenerationConfig, MultimodalRunner

    _, pte, _, model, processor = llava
    image = vision_language.write_image(tmp_path / "image.png", seed=4)
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and this?"}]}]
    text = processor.apply_chat_template(turn, add_generation_prompt=True)
    inputs = processor(images=rgb(image), text=text, return_tensors="pt", add_special_tokens=False)
    runner = MultimodalRunner(pte, os.path.join(os.path.dirname(pte), "tokenizer.json"))
    config = GenerationConfig()
    config.max_new_tokens, config.temperature, config.echo = NEW_TOKENS, 0.0, False
    pieces = []
    runner.generate_hf(inputs, config, token_callback=pieces.append, image_token_id=model.config.image_token_id)
    tokens, eos = eager(model, processor, "and this?", image), model.generation_config.eos_token_id
    tokens = tokens[:tokens.index(eos)] if eos in tokens else tokens
    assert "".join(pieces) == processor.tokenizer.decode(tokens, skip_special_tokens=True)


def test_a_text_turn_runs_the_language_model_alone(llava):
    _, pte, _, model, processor = llava
    tokenizer = processor.tokenizer
    text = processor.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    tokens = list(generate_tokens(Session(runtimes.load(pte)), ids, NEW_TOKENS, stop_at_eos=False))
    assert tokens == eager(model, processor, "hello there")


def test_a_conversation_with_two_images_follows_eager(llava, tmp_path):
    """Chat turns with images: each turn feeds only what the cache does not hold (the
    second image's placeholders sit past the first turn's), each image encoded once."""
    from etmlx.llm.chat import Chat

    _, pte, _, model, processor = llava
    images = [rgb(vision_language.write_image(tmp_path / f"{i}.png", seed=10 + i)) for i in range(2)]
    chat = Chat(Session(runtimes.load(pte)), processor.tokenizer, max_new_tokens=NEW_TOKENS, processor=processor)
    eos = model.generation_config.eos_token_id
    for text, image in (("first?", images[0]), ("and then?", None), ("second?", images[1])):
        reply = "".join(chat.reply(text, image))
        text_so_far = processor.apply_chat_template(chat.messages[:-1], add_generation_prompt=True)
        inputs = processor(images=chat.images, text=text_so_far, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos)
        expected = [t for t in out[0, inputs["input_ids"].shape[1]:].tolist() if t != eos]
        assert reply == processor.tokenizer.decode(expected, skip_special_tokens=True)
    assert chat.fed_from > 0 and len(chat.encoded) == 2  # the last turn fed past the cached first ones


def test_serve_answers_messages_with_image_parts(llava, tmp_path):
    """``etmlx serve`` on the file: a chat message of an OpenAI ``image_url`` part (a data:
    URL) and text gives eager's text for that turn; the same prompt with another image
    (its placeholders the same tokens) gives that image's, not a cache of the first."""
    from pathlib import Path

    from servers import image_part, post, serving

    _, pte, _, model, processor = llava
    eos = model.generation_config.eos_token_id
    with serving(Path(pte)) as url:
        for seed in (1, 2):
            image = vision_language.write_image(tmp_path / f"image{seed}.png", seed=seed)
            content = [image_part(rgb(image)), {"type": "text", "text": "what is it?"}]
            status, reply = post(url, {"model": "tiny", "messages": [{"role": "user", "content": content}],
                                       "max_tokens": 10, "temperature": 0})
            tokens = eager(model, processor, "what is it?", image)
            tokens = tokens[:tokens.index(eos)] if eos in tokens else tokens
            assert status == 200, reply
            assert reply["choices"][0]["message"]["content"] == processor.tokenizer.decode(tokens)
        broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        status, reply = post(url, {"model": "tiny", "messages": [{"role": "user", "content": [broken]}]})
        assert status == 400 and "no image Pillow can decode" in reply["error"]["message"]


def test_generate_with_two_images_prints_the_text(llava, tmp_path):
    """``--image`` twice: one user turn [both images, prompt]."""
    _, pte, _, model, processor = llava
    images = [vision_language.write_image(tmp_path / "photo.jpg", seed=3),
              vision_language.write_image(tmp_path / "photo.png", seed=4, size=(30, 70))]
    done = subprocess.run([sys.executable, "-m", "etmlx.cli", "generate", pte, "--image", images[0], "--image",
                           images[1], "--prompt", "describe", "--max-new-tokens", str(NEW_TOKENS), "--runtime",
                           "executorch"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tokens, eos = eager(model, processor, "describe", images), model.generation_config.eos_token_id
    tokens = tokens[:tokens.index(eos)] if eos in tokens else tokens  # generate stops at EOS
    assert done.stdout.rstrip("\n") == processor.tokenizer.decode(tokens, skip_special_tokens=True)


def test_bad_images_and_programs_get_one_line(llava, tmp_path):
    _, pte, _, _, _ = llava
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but then nothing an image holds")
    for image, message in ((tmp_path / "missing.png", "no such image file"), (broken, "not an image Pillow can decode")):
        done = subprocess.run([sys.executable, "-m", "etmlx.cli", "generate", pte, "--image", str(image), "--prompt",
                               "hi"], capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    image = vision_language.write_image(tmp_path / "image.png")
    ids, pixel_values = image_prompt(os.path.dirname(pte), "word " * 150, image)
    session = Session(etmlx.load(pte))
    session.images = PromptImages(session.program, pixel_values, ids)
    with pytest.raises(GenerationError, match=r"the prompt's \d+ tokens are past the context of 160 tokens"):
        list(generate_tokens(session, ids, 4))
    from transformers import LlavaNextConfig

    tiles = tmp_path / "llava_next"
    LlavaNextConfig().save_pretrained(tiles)
    with pytest.raises(etmlx.ExportError, match="a llava_next vision-language model, which etmlx does not export yet"):
        etmlx.export_llm(tiles, tmp_path / "llava_next.pte")
    mlp = tmp_path / "mlp.pte"
    etmlx.export(torch.nn.Linear(4, 4), (torch.zeros(1, 4),), mlp)
    with pytest.raises(GenerationError, match="takes no images"):
        PromptImages(etmlx.load(mlp), pixel_values, ids)
