"""Qwen's vision-language prompts (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) for an export
(``grid_encoder``): ``QwenVLProcessor`` makes what transformers' ``Qwen2_5_VLProcessor``
(``Qwen3VLProcessor``) makes of a prompt, from the folder's tokenizer, image processor and
chat template: transformers' processor also builds a video processor, which needs
torchvision.

Qwen's processor resizes each image to a grid of its own (its aspect ratio kept, its pixel
count within the processor's bounds). The exported encoders take any grid up to the
export's pixel count, which is written into the copied processor config as its upper
bound (``MAX_PIXELS_KEY``), so every image keeps its shape."""

import json
import math
import os

# In the preprocessor_config.json copied beside the .pte: the most pixels its images may
# have; or (a Qwen2.5-VL file of etmlx before it took images at their own shapes) the one
# (height, width) its images are resized to
MAX_PIXELS_KEY, IMAGE_SIZE_KEY = "etmlx_max_pixels", "etmlx_image_size"
IMAGE_PAD = "<|image_pad|>"
DEFAULT_SIDE = 448  # pixels: 256 tokens an image at Qwen2.5-VL's 14-pixel patches merged 2 x 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280  # Qwen2VLImageProcessor's bounds where its config names none
MAX_ASPECT = 16  # the longest image an export takes, as a multiple of its height (``longest_side``)


def longest_side(max_rows: int) -> int:
    """The most merged patches a side of an image of at most ``max_rows`` of them may
    have: ExecuTorch plans an encoder's input and output at the largest sides together
    (sides up to ``max_rows`` would plan ``max_rows`` squared rows), so a side is bounded
    to keep that within ``MAX_ASPECT`` times ``max_rows``: images up to that aspect ratio."""
    return min(max_rows, math.isqrt(MAX_ASPECT * max_rows))


def is_qwen(folder) -> bool:
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
    size = processor_config.get("size") or {}  # or min_pixels and max_pixels (the Hub's files), else the defaults
    least = processor_config.get("min_pixels", size.get("shortest_edge", MIN_PIXELS))  # (the processor's order)
    most = processor_config.get("max_pixels", size.get("longest_edge", MAX_PIXELS))
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


class QwenVLProcessor:
    """``apply_chat_template`` and ``__call__`` as ``Qwen2_5_VLProcessor`` has them, for
    the folder beside an export (its image size or pixel bound read from its preprocessor
    config): the ids (each ``<|image_pad|>`` repeated once per merged patch), the patches
    (``pixel_values``), ``image_grid_thw`` and ``mm_token_type_ids`` for transformers'
    model, and ``pixel_rows``, a ``[3, H, W]`` image for each, for the exported
    ``vision_encoder``. ``image_size``: every image resized to it (else the folder's)."""

    def __init__(self, folder, image_size=None):
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

        from etmlx.llm.generation import GenerationError

        config = preprocessor_config(folder)
        if not (image_size or config.get(MAX_PIXELS_KEY) or config.get(IMAGE_SIZE_KEY)):
            raise GenerationError(f"{folder}: its preprocessor_config.json names no {MAX_PIXELS_KEY}, the most pixels "
                                  "of the images the .pte takes: export the model with etmlx export-llm, which "
                                  "writes it")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
        self.image_size = tuple(image_size or config.get(IMAGE_SIZE_KEY) or ()) or None
        self.max_pixels = config.get(MAX_PIXELS_KEY)
        self.chat_template = _chat_template(folder) or self.tokenizer.chat_template

    def apply_chat_template(self, messages: list, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def __call__(self, images=None, text: str = "", return_tensors: str = "pt", add_special_tokens: bool = False):
        import torch
        from PIL import Image

        from etmlx.llm.generation import GenerationError

        images = [image.convert("RGB") for image in images or []]
        pieces = text.split(IMAGE_PAD)
        if len(pieces) - 1 != len(images):
            raise GenerationError(f"the prompt holds {len(pieces) - 1} {IMAGE_PAD} for {len(images)} images")
        inputs = {}
        if images:
            if self.image_size:
                height, width = self.image_size
                images = [image.resize((width, height), Image.Resampling.BICUBIC) for image in images]
            inputs = dict(self.image_processor(images=images, return_tensors="pt"))
            grids = inputs["image_grid_thw"]
            self._check_sides(grids, images)
            merged = (grids.prod(-1) // self.image_processor.merge_size ** 2).tolist()
            text = pieces[0] + "".join(IMAGE_PAD * count + piece for count, piece in zip(merged, pieces[1:]))
            inputs["pixel_rows"] = self.rows(inputs["pixel_values"], grids)
        encoded = self.tokenizer(text, add_special_tokens=add_special_tokens, return_tensors=return_tensors)
        image_token = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        inputs.update(encoded, mm_token_type_ids=(encoded["input_ids"] == image_token).to(torch.int32))
        return inputs

    def _check_sides(self, grids, images: list) -> None:
        """A GenerationError for an image the processor made longer a side (in merged
        patches) than the export's encoder takes (``longest_side``)."""
        from etmlx.llm.generation import GenerationError

        merge = self.image_processor.merge_size
        most = self.max_pixels // (self.image_processor.patch_size * merge) ** 2 if self.max_pixels else None
        for image, (_, height, width) in zip(images, grids.tolist()):
            if most and max(height, width) // merge > longest_side(most):
                raise GenerationError(f"a {image.width} x {image.height} image: the processor makes it "
                                      f"{height // merge} x {width // merge} merged patches, and the export takes at "
                                      f"most {longest_side(most)} a side (an aspect ratio up to about {MAX_ASPECT}): "
                                      "crop it, or export with a larger --image-size")

    def rows(self, patches, grids) -> list:
        """The processor's ``patches`` of images of ``grids`` (``image_grid_thw``) back as a
        ``[3, H, W]`` image each: its patchify undone (one of its equal temporal copies kept)."""
        images = self.image_processor
        patch, merge, copies = images.patch_size, images.merge_size, images.temporal_patch_size
        rows = []
        for image, (_, height, width) in zip(patches.split(grids.prod(-1).tolist()), grids.tolist()):
            grid = (height // merge, width // merge, merge, merge, 3, copies, patch, patch)
            # (rows, columns, row in merge, column in merge, channel, copy, y, x)
            image = image.reshape(grid)[:, :, :, :, :, 0].permute(4, 0, 2, 5, 1, 3, 6)
            rows.append(image.reshape(3, height * patch, width * patch))
        return rows


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


def write_max_pixels(folder, size: tuple) -> None:
    """Records in ``folder``'s preprocessor_config.json (a copy beside an export) that its
    images have at most the pixels of ``size`` (height, width): the processor's own upper
    bound lowered to that, and ``MAX_PIXELS_KEY``."""
    config = preprocessor_config(folder)
    pixels = size[0] * size[1]
    config[MAX_PIXELS_KEY] = pixels
    config["size"] = {"shortest_edge": config.get("min_pixels", MIN_PIXELS), **(config.get("size") or {}),
                      "longest_edge": pixels}
    if "max_pixels" in config:  # (which the processor reads before its size)
        config["max_pixels"] = pixels
    with open(os.path.join(os.fspath(folder), "preprocessor_config.json"), "w") as f:
        json.dump(config, f, indent=2)
