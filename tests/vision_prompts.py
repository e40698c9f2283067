"""What the vision-language tests compare with: transformers' greedy tokens after a user
turn of an image and a prompt, from the checkpoint's own processor."""

import torch


def eager(model, processor, prompt: str, image=None, new_tokens: int = 10) -> list:
    """transformers' greedy tokens after a user turn [image (or a list of images), prompt]
    (EOS not stopping it)."""
    images = [rgb(path) for path in (image if isinstance(image, list) else [image] if image else [])] or None
    content = [{"type": "image"}] * len(images or []) + [{"type": "text", "text": prompt}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(images=images, text=text, return_tensors="pt", add_special_tokens=False)
    inputs.pop("pixel_rows", None)  # etmlx's, for its vision encoder (etmlx.multimodal.qwen_processor)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def rgb(path):
    from PIL import Image

    return Image.open(path).convert("RGB")


def image_turn(program, pte, prompt: str, image, new_tokens: int = 10) -> list:
    """``program``'s greedy tokens after the same turn, from the processor saved beside
    ``pte`` (``etmlx.multimodal.images``)."""
    import os

    from etmlx.llm.generation import Session, generate_tokens
    from etmlx.multimodal.images import PromptImages, image_prompt

    ids, pixel_values = image_prompt(os.path.dirname(pte), prompt, image)
    session = Session(program)
    session.images = PromptImages(program, pixel_values, ids)
    return list(generate_tokens(session, ids, new_tokens, stop_at_eos=False))


def runner_and_eager_text(pte, model, processor, prompt: str, image, new_tokens: int = 10) -> tuple:
    """(ExecuTorch's C++ MultimodalRunner's text, transformers' greedy text up to its EOS)
    after the same turn: the runner (its Python binding, on etmlx's native backend) takes
    the prompt as ``runner_inputs`` lists it, each image or tile in its placeholders' place."""
    import os

    import etmlx.native  # noqa: F401  (registers the backend with ExecuTorch's runtime)
    from executorch.extension.llm.runner import GenerationConfig, MultimodalRunner

    from etmlx.multimodal.images import image_prompt, runner_inputs

    ids, pixel_values = image_prompt(os.path.dirname(pte), prompt, image)
    runner = MultimodalRunner(pte, os.path.join(os.path.dirname(pte), "tokenizer.json"))
    config = GenerationConfig()
    config.max_new_tokens, config.temperature, config.echo = new_tokens, 0.0, False
    pieces = []
    runner.generate(runner_inputs(ids, pixel_values, model.config.image_token_id), config, pieces.append, None)
    tokens, eos = eager(model, processor, prompt, image, new_tokens), model.generation_config.eos_token_id
    tokens = tokens[:tokens.index(eos)] if eos in tokens else tokens
    return "".join(pieces), processor.tokenizer.decode(tokens)
