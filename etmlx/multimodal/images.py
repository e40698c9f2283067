"""Prompts with images for a vision-language program (``export``): the checkpoint's
processor makes the prompt's ids (each image's placeholder token repeated once per feature
row) and the pixel values; ``vision_encoder`` makes the features, which take the
placeholders' places among the prompt's token embeddings in ``text_decoder``'s calls
(``PromptImages``)."""

import bisect
import os

from etmlx.llm.generation import GenerationError

IMAGE_METHODS = ("vision_encoder", "token_embedding", "text_decoder", "image_token_id")
# What a program that takes no images is told to export instead (``export.MODEL_TYPES``)
NEEDS_IMAGE_METHODS = ("takes no images: export a vision-language checkpoint (LLaVA, Idefics3, SmolVLM, Gemma 3, "
                       "Qwen2-VL, Qwen2.5-VL, Qwen3-VL) with etmlx export-llm")


def image_prompt(folder, prompt: str, images) -> tuple:
    """``(ids, pixel_values)`` of one user turn [``images`` (a PIL image or its path, or a
    list of them), ``prompt``] with the generation prompt, by the processor saved in
    ``folder`` (its chat template and image preprocessing)."""
    images = images if isinstance(images, (list, tuple)) else [images]
    images = [read_image(image) if isinstance(image, (str, os.PathLike)) else image for image in images]
    turn = [{"role": "user", "content": [{"type": "image"}] * len(images) + [{"type": "text", "text": prompt}]}]
    return conversation_prompt(load_processor(folder), turn, images)


def conversation_prompt(processor, messages: list, images: list) -> tuple:
    """``(ids, pixel_values)`` of ``messages`` (their image parts standing for ``images``,
    in order) in the processor's chat template, up to the assistant's turn; the pixel
    values ``[images or tiles, 3, H, W]``, in the order of their placeholders."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=images, text=text, return_tensors="pt", add_special_tokens=False)
    return inputs["input_ids"][0].tolist(), image_rows(inputs)


def image_rows(inputs):
    """A processor's ``pixel_values`` as ``vision_encoder`` takes them, one image (LLaVA)
    or one tile (Idefics3 and SmolVLM split each image into tiles: ``[1, tiles, 3, H, W]``)
    a row, in the order of their placeholders (Qwen's: the ``pixel_rows``
    ``qwen_processor.QwenVLProcessor`` adds, a list of images of their own sizes). A tile
    the processor padded (its ``pixel_attention_mask``) is refused: the exported encoder
    computes full tiles only."""
    if "pixel_rows" in inputs:  # Qwen's: each image its own size
        return inputs["pixel_rows"]
    pixels = inputs["pixel_values"]
    pixels = pixels.reshape(-1, *pixels.shape[-3:])
    mask = inputs.get("pixel_attention_mask")
    if mask is not None:
        mask = mask.reshape(-1, *mask.shape[-2:])
        real = mask.flatten(1).any(1)  # a batch's padding tiles (all zero) hold no placeholders
        if not mask[real].all():
            raise GenerationError("the processor padded a tile of this image, and etmlx's vision encoder computes "
                                  "full tiles only")
        pixels = pixels[real]
    return pixels


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


def processor_for(program, folder):
    """The processor saved in ``folder`` beside a vision-language ``program``
    (``load_processor``), or None for a program that takes no images."""
    if not all(name in program.method_names for name in IMAGE_METHODS):
        return None
    return load_processor(folder)


def load_processor(folder):
    """The processor saved in ``folder`` beside a vision-language export: transformers'
    ``AutoProcessor``, or for the Qwen VL models ``qwen_processor.QwenVLProcessor`` (no
    torchvision needed)."""
    from . import qwen_processor

    if qwen_processor.is_qwen(folder):
        return qwen_processor.QwenVLProcessor(folder)
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(folder)


def first_placeholder(ids: list, image_token: int) -> int:
    """The position of the first image placeholder in ``ids`` (their length if none)."""
    return ids.index(image_token) if image_token in ids else len(ids)


def check_takes_images(program, path) -> None:
    missing = [name for name in IMAGE_METHODS if name not in program.method_names]
    if missing:
        raise GenerationError(f"{path} {NEEDS_IMAGE_METHODS} (it lacks {', '.join(missing)})")


class PromptImages:
    """The image features of a prompt's placeholder tokens (``Session.images``). ``ids``
    is the whole prompt from position 0, ``pixel_values`` its images (or tiles) in order,
    a ``[3, H, W]`` each: batch rows, or a list of images of their own sizes
    (``image_rows``). A chunk fed at positions that hold placeholders runs through
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
        for image in range(len(encoded), len(pixel_values)):  # outputs come back as torch tensors, as given
            features = program.run_method("vision_encoder", [pixel_values[image][None]])[0]
            encoded.append(features.reshape(-1, features.shape[-1]))
        self.features = torch.cat(encoded[:len(pixel_values)])
        self.slots = [position for position, token in enumerate(ids) if token == image_token]
        if len(self.slots) != len(self.features):
            raise GenerationError(f"the prompt holds {len(self.slots)} image tokens for {len(self.features)} rows "
                                  "of image features")

    def chunk_end(self, start: int, end: int) -> int:
        """``end``, or the first position of the image whose placeholders it would split
        when that image starts after ``start`` (``Session._chunks``)."""
        row = bisect.bisect_left(self.slots, end)
        if 0 < row < len(self.slots) and self.slots[row - 1] == end - 1 and self.slots[row] == end:
            first = row - 1  # the placeholders run on across end: back to where they begin
            while first > 0 and self.slots[first - 1] == self.slots[first] - 1:
                first -= 1
            if self.slots[first] > start:
                return self.slots[first]
        return end

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


def runner_inputs(ids: list, pixel_values, image_token_id: int) -> list:
    """The prompt as ExecuTorch's ``MultimodalRunner`` takes it (``MultimodalInput``s):
    the tokens between images, and each run of ``image_token_id`` placeholders as the
    next row of ``pixel_values`` (``image_rows``: an image, or a tile, which the runner
    encodes and prefills in one call). Its ``generate_hf`` reads one image from a
    processor's output; a prompt of several images, or of an image split into tiles
    (Idefics3, SmolVLM), goes in this form (``runner.generate(inputs, config, ...)``)."""
    from executorch.extension.llm.runner import make_image_input, make_token_input

    runs, start = [], 0
    for position in range(1, len(ids) + 1):
        if position == len(ids) or (ids[position] == image_token_id) != (ids[start] == image_token_id):
            runs.append(ids[start:position])
            start = position
    images = [run for run in runs if run[0] == image_token_id]
    one_size = len({tuple(image.shape) for image in pixel_values}) == 1
    if len(images) != len(pixel_values) or (one_size and len({len(run) for run in images}) > 1):
        raise GenerationError(f"the prompt holds {len(images)} runs of image tokens "
                              f"({', '.join(str(len(run)) for run in images) or 'none'} long) for "
                              f"{len(pixel_values)} images or tiles")
    rows = iter(range(len(pixel_values)))
    return [make_image_input(pixel_values[next(rows)][None].contiguous()) if run[0] == image_token_id
            else make_token_input(run) for run in runs]
