"""Prompts with images for a vision-language program (``export``): the checkpoint's
processor makes the prompt's ids (each image's placeholder token repeated once per feature
row) and the pixel values; ``vision_encoder`` makes the features, which take the
placeholders' places among the prompt's token embeddings in ``text_decoder``'s calls
(``PromptImages``)."""

import bisect
import os

from etmlx.llm.generation import GenerationError

IMAGE_METHODS = ("vision_encoder", "token_embedding", "text_decoder", "image_token_id")


def image_prompt(folder, prompt: str, image) -> tuple:
    """``(ids, pixel_values)`` of one user turn [``image`` (a PIL image, or its path),
    ``prompt``] with the generation prompt, by the processor saved in ``folder`` (its chat
    template and image preprocessing)."""
    from transformers import AutoProcessor

    image = read_image(image) if isinstance(image, (str, os.PathLike)) else image
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return conversation_prompt(AutoProcessor.from_pretrained(folder), turn, [image])


def conversation_prompt(processor, messages: list, images: list) -> tuple:
    """``(ids, pixel_values)`` of ``messages`` (their image parts standing for ``images``,
    in order) in the processor's chat template, up to the assistant's turn."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=images, text=text, return_tensors="pt", add_special_tokens=False)
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


class PromptImages:
    """The image features of a prompt's placeholder tokens (``Session.images``). ``ids``
    is the whole prompt from position 0, ``pixel_values`` its images in order (one batch
    row each). A chunk fed at positions that hold placeholders runs through
    ``text_decoder`` with those placeholders' feature rows in their places, wherever the
    chunk starts (a cache that holds the first images already feeds only the rest); every
    other call is ``forward``'s (a placeholder token generated later is embedded as a
    token, as transformers' generate embeds it). ``encoded``: features of earlier images
    (a list, extended with the new ones), so a conversation encodes each image once."""

    def __init__(self, program, pixel_values, ids: list, encoded: list | None = None):
        import torch

        check_takes_images(program, "this program")
        self.program = program
        image_token = int(program.run_method("image_token_id", [])[0])
        encoded = encoded if encoded is not None else []
        for image in range(len(encoded), pixel_values.shape[0]):  # outputs come back as torch tensors, as given
            features = program.run_method("vision_encoder", [pixel_values[image:image + 1]])[0]
            encoded.append(features.reshape(-1, features.shape[-1]))
        self.features = torch.cat(encoded[:pixel_values.shape[0]])
        self.slots = [position for position, token in enumerate(ids) if token == image_token]
        if len(self.slots) != len(self.features):
            raise GenerationError(f"the prompt holds {len(self.slots)} image tokens for {len(self.features)} rows "
                                  "of image features")

    def _rows(self, start: int, count: int) -> list:
        """(slot within the chunk, feature row) of the placeholders at positions [start, start + count)."""
        first = bisect.bisect_left(self.slots, start)
        last = bisect.bisect_left(self.slots, start + count)
        return [(self.slots[row] - start, row) for row in range(first, last)]

    def placed_in(self, start: int, tokens: list) -> bool:
        return bool(self._rows(start, len(tokens)))

    def feed(self, session, tokens: list):
        import torch

        embeddings = self.program.run_method("token_embedding", [torch.tensor([tokens])])[0]  # a copy: ours to fill
        rows = self._rows(session.position, len(tokens))
        embeddings[0, [slot for slot, _ in rows]] = self.features[[row for _, row in rows]].to(embeddings.dtype)
        return session.run_at_next_positions("text_decoder", embeddings, len(tokens))

