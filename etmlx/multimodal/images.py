"""Prompts with images for a vision-language program (``export``): the checkpoint's
processor makes the prompt's ids (each image's placeholder token repeated once per feature
row) and the pixel values; ``vision_encoder`` makes the features, which take the
placeholders' places among the prompt's token embeddings in ``text_decoder``'s calls."""

import os

import numpy as np

from etmlx.llm.generation import GenerationError

IMAGE_METHODS = ("vision_encoder", "token_embedding", "text_decoder", "image_token_id")


def image_prompt(folder, prompt: str, image) -> tuple:
    """``(ids, pixel_values)`` of one user turn [``image`` (a PIL image, or its path),
    ``prompt``] with the generation prompt, by the processor saved in ``folder`` (its chat
    template and image preprocessing)."""
    from transformers import AutoProcessor

    image = read_image(image) if isinstance(image, (str, os.PathLike)) else image
    processor = AutoProcessor.from_pretrained(folder)
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(turn, add_generation_prompt=True)
    inputs = processor(images=image, text=text, return_tensors="pt", add_special_tokens=False)
    return inputs["input_ids"][0].tolist(), inputs["pixel_values"]


def read_image(path):
    """The image at ``path`` in RGB (Pillow), or one GenerationError naming what is wrong."""
    from PIL import Image, UnidentifiedImageError

    if not os.path.isfile(path):
        raise GenerationError(f"{path}: no such image file")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise GenerationError(f"{path}: not an image Pillow can decode ({error})") from None


def check_takes_images(program, path) -> None:
    missing = [name for name in IMAGE_METHODS if name not in program.method_names]
    if missing:
        raise GenerationError(f"{path} takes no images (it lacks {', '.join(missing)}): export a vision-language "
                              "checkpoint (LLaVA) with etmlx export-llm")


class PendingImages:
    """Image features waiting for their placeholder tokens (``Session.images``): a chunk of
    the prompt that holds placeholders runs through ``text_decoder`` with the next feature
    rows in their places; chunks without, and placeholder tokens past the features (a
    generated one, say), run as ids, as transformers' generate embeds them."""

    def __init__(self, program, pixel_values):
        import torch

        check_takes_images(program, "this program")
        self.program = program
        self.image_token = int(program.run_method("image_token_id", [])[0])
        features = _tensor(program.run_method("vision_encoder", [pixel_values])[0])
        self.features, self.used = features.reshape(-1, features.shape[-1]), 0
        self._torch = torch

    def placed_in(self, tokens: list) -> bool:
        return self.used < len(self.features) and self.image_token in tokens

    def feed(self, session, tokens: list):
        embeddings = _tensor(self.program.run_method("token_embedding", [np.asarray([tokens], dtype=np.int64)])[0])
        embeddings = embeddings.clone()
        slots = [i for i, token in enumerate(tokens) if token == self.image_token][:len(self.features) - self.used]
        embeddings[0, slots] = self.features[self.used:self.used + len(slots)].to(embeddings.dtype)
        self.used += len(slots)
        return session.run_at_next_positions("text_decoder", embeddings, len(tokens))


def _tensor(value):
    import torch

    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
