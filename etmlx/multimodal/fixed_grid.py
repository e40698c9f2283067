"""Qwen2.5-VL's (and Qwen2-VL's, Qwen3-VL's) image preprocessing at the one image size its exported
vision encoder computes (``grid_encoder``): ``FixedGridProcessor`` makes what transformers'
``Qwen2_5_VLProcessor`` makes of a prompt, each image first resized to that size.

Qwen's processor resizes each image to its own grid of patches (its aspect ratio kept,
its pixel count within the processor's bounds); the encoder's window order and rotary
positions are computed from that grid in Python, so an export fixes one grid, and every
image is resized to it. Built from the folder's tokenizer, image processor and chat
template: transformers' processor also builds a video processor, which needs torchvision."""

import json
import os

IMAGE_SIZE_KEY = "etmlx_image_size"  # (height, width), in the preprocessor_config.json copied beside the .pte
IMAGE_PAD = "<|image_pad|>"
DEFAULT_SIDE = 448  # pixels: 256 tokens an image at Qwen2.5-VL's 14-pixel patches merged 2 x 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280  # Qwen2VLImageProcessor's bounds where its config names none


def is_fixed_grid(folder) -> bool:
    """Whether ``folder``'s image processor is Qwen2-VL's (patches merged into a grid)."""
    config = preprocessor_config(folder)
    return str(config.get("image_processor_type", "")).startswith("Qwen2VLImageProcessor")


def image_size(processor_config: dict, requested=None) -> tuple:
    """(height, width) of the images an export takes: ``requested`` (an int or a pair), else
    the largest square of at most ``DEFAULT_SIDE`` pixels the processor's bounds allow, each
    side a multiple of a merged patch; an ExportError when it is not one or lies outside
    the processor's pixel bounds."""
    from etmlx.errors import ExportError

    factor = processor_config.get("patch_size", 14) * processor_config.get("merge_size", 2)
    size = processor_config.get("size") or {}  # else min_pixels and max_pixels (the Hub's files), else the defaults
    least = size.get("shortest_edge", processor_config.get("min_pixels", MIN_PIXELS))
    most = size.get("longest_edge", processor_config.get("max_pixels", MAX_PIXELS))
    if requested is None:
        side = max(factor, min(DEFAULT_SIDE, int(most ** 0.5)) // factor * factor)
        requested = (side, side)
    height, width = (requested, requested) if isinstance(requested, int) else tuple(requested)
    if height % factor or width % factor or height <= 0 or width <= 0:
        raise ExportError(f"image size {height}x{width}: each side must be a positive multiple of {factor} pixels "
                          "(the model's patch size times its merge size)")
    if not least <= height * width <= most:
        raise ExportError(f"image size {height}x{width}: {height * width} pixels, outside the processor's "
                          f"{least} to {most}")
    return height, width


class FixedGridProcessor:
    """``apply_chat_template`` and ``__call__`` as ``Qwen2_5_VLProcessor`` has them, for
    the folder beside an export (``image_size`` read from its preprocessor config): the
    ids (each ``<|image_pad|>`` repeated once per merged patch), the patches
    (``pixel_values``), ``image_grid_thw`` and ``mm_token_type_ids`` for transformers'
    model, and ``pixel_rows`` ``[images, 3, H, W]`` for the exported ``vision_encoder``."""

    def __init__(self, folder, image_size=None):
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

        from etmlx.llm.generation import GenerationError

        config = preprocessor_config(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
        self.image_size = tuple(image_size or config.get(IMAGE_SIZE_KEY) or ())
        if len(self.image_size) != 2:
            raise GenerationError(f"{folder}: its preprocessor_config.json names no {IMAGE_SIZE_KEY}, the size of "
                                  "the images the .pte takes: export the model with etmlx export-llm, which writes it")
        self.chat_template = _chat_template(folder) or self.tokenizer.chat_template

    def apply_chat_template(self, messages: list, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def __call__(self, images=None, text: str = "", return_tensors: str = "pt", add_special_tokens: bool = False):
        import torch
        from PIL import Image

        from etmlx.llm.generation import GenerationError

        images = list(images or [])
        pieces = text.split(IMAGE_PAD)
        if len(pieces) - 1 != len(images):
            raise GenerationError(f"the prompt holds {len(pieces) - 1} {IMAGE_PAD} for {len(images)} images")
        height, width = self.image_size
        inputs = {}
        if images:
            resized = [image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC) for image in images]
            inputs = dict(self.image_processor(images=resized, return_tensors="pt"))
            merged = int(inputs["image_grid_thw"][0].prod()) // self.image_processor.merge_size ** 2
            text = (IMAGE_PAD * merged).join(pieces)
            inputs["pixel_rows"] = self.rows(inputs["pixel_values"], len(images))
        encoded = self.tokenizer(text, add_special_tokens=add_special_tokens, return_tensors=return_tensors)
        image_token = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        inputs.update(encoded, mm_token_type_ids=(encoded["input_ids"] == image_token).to(torch.int32))
        return inputs

    def rows(self, patches, count: int):
        """The processor's ``patches`` of ``count`` images back as ``[count, 3, H, W]``:
        its patchify undone (one of its equal temporal copies kept)."""
        images, (height, width) = self.image_processor, self.image_size
        patch, merge, copies = images.patch_size, images.merge_size, images.temporal_patch_size
        grid = (count, height // patch // merge, width // patch // merge, merge, merge, 3, copies, patch, patch)
        # (image, rows, columns, row in merge, column in merge, channel, copy, y, x)
        rows = patches.reshape(grid)[:, :, :, :, :, :, 0].permute(0, 5, 1, 3, 6, 2, 4, 7)
        return rows.reshape(count, 3, height, width)


def preprocessor_config(folder) -> dict:
    """``folder``'s preprocessor_config.json ({} when it has none or it does not parse)."""
    try:
        with open(os.path.join(os.fspath(folder), "preprocessor_config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _chat_template(folder):
    """The processor's chat template, as a Qwen2.5-VL folder holds it (a .jinja file or
    chat_template.json), else None."""
    folder = os.fspath(folder)
    if os.path.isfile(os.path.join(folder, "chat_template.jinja")):
        with open(os.path.join(folder, "chat_template.jinja")) as f:
            return f.read()
    if os.path.isfile(os.path.join(folder, "chat_template.json")):
        with open(os.path.join(folder, "chat_template.json")) as f:
            return json.load(f).get("chat_template")
    return None


def write_image_size(folder, size: tuple) -> None:
    """Records ``size`` in ``folder``'s preprocessor_config.json (a copy beside an export)."""
    config = preprocessor_config(folder)
    config[IMAGE_SIZE_KEY] = list(size)
    with open(os.path.join(os.fspath(folder), "preprocessor_config.json"), "w") as f:
        json.dump(config, f, indent=2)
