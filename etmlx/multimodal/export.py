"""``etmlx export-llm`` of an image-text-to-text checkpoint (LLaVA: a vision tower, a
projector and a causal LM; Idefics3 and SmolVLM: a vision model over the tiles their
processor splits an image into, a connector and a causal LM; Gemma 3; Qwen2-VL,
Qwen2.5-VL and Qwen3-VL, of positions in three dimensions) to one ``.pte`` in
ExecuTorch's multimodal convention:

- ``vision_encoder(pixel_values [1, 3, H, W]) -> image features [1, n, hidden]`` of one
  image or tile (``image_program.VisionEncoder``; Qwen: ``grid_encoder``, at the
  one image size the export fixes, which it records in the copied preprocessor config);
- ``token_embedding(tokens [1, n]) -> embeddings [1, n, hidden]``;
- ``text_decoder(embeddings, cache_position) -> logits [1, vocab]``;
- ``forward(tokens, cache_position)`` and the LLM runner's constant methods
  (``etmlx.llm.causal_lm``), over the same KV cache, so text-only generation, chat and
  serving run the file as they run a language model's; ``image_token_id``.

A call takes at least as many positions as an image has tokens (``get_max_seq_len`` is
raised to that): ExecuTorch's MultimodalRunner prefills an image's embeddings in one call.

The processor's files (its image preprocessing and chat template) are copied beside it."""

import copy
import json
import os
import time

from etmlx.errors import ExportError

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# The model types whose image features and attention etmlx's methods reproduce (tested
# against eager). Others export without an error but would compute other numbers
# (LLaVA-NeXT's tiles are unpadded per image), so they are refused by name.
MODEL_TYPES = ("llava", "idefics3", "smolvlm", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
# The kind of text_decoder a model type takes (``etmlx.llm.causal_lm.export_methods``'
# ``embeddings``): Gemma 3's image tokens attend to every token of their image, so its rows
# carry a channel marking an image's (``MarkedEmbeddedCausalLM``); Qwen2-VL's and
# Qwen2.5-VL's (and Qwen3-VL's) rows carry their place in its three-dimensional RoPE
# (``PositionedEmbeddedCausalLM``).
EMBEDDINGS = {"gemma3": "marked", "qwen2_vl": "positioned", "qwen2_5_vl": "positioned", "qwen3_vl": "positioned",
              "qwen3_vl_moe": "positioned"}
# The causal-LM class ``text_model`` puts over a text model that has none (Qwen's VL ones)
SHELLS = {"qwen2_vl_text": "Qwen2ForCausalLM", "qwen2_5_vl_text": "Qwen2ForCausalLM",
          "qwen3_vl_text": "Qwen3ForCausalLM", "qwen3_vl_moe_text": "Qwen3MoeForCausalLM"}


def is_image_text(model_dir) -> bool:
    """Whether ``model_dir``'s config.json describes a model of a vision and a text part."""
    try:
        with open(os.path.join(os.fspath(model_dir), "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config and "text_config" in config


def export_image_text(model_dir, output, *, max_context=None, max_seq_len: int = 128, quantize=None, group_size=64,
                      dtype=None, progress=None, image_size=None):
    """Exports the image-text-to-text model in ``model_dir`` to ``output`` (inside
    ``lowering.deferred.scope()``: quantized weights are computed as they are packed);
    the options as ``etmlx.llm.export.export_llm`` takes them. ``image_size``: (height,
    width) or one side of the image whose pixel count a Qwen VL export's images keep
    within (default: ``qwen_processor.image_size``'s). Returns the ExportResult."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from etmlx.exporter import export_methods
    from etmlx.llm import causal_lm
    from etmlx.llm.checkpoint_files import copy_tokenizer, load_checkpoint, load_processor

    from . import image_program, qwen_processor

    report = progress or (lambda stage, seconds: None)
    started = time.perf_counter()
    with open(os.path.join(model_dir, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ExportError(f"{model_dir}: a {model_type} vision-language model, which etmlx does not export yet; "
                          f"it exports {', '.join(MODEL_TYPES)} (and causal LMs, Whisper)")
    embeddings = EMBEDDINGS.get(model_type, True)
    if embeddings == "positioned":
        config = qwen_processor.preprocessor_config(model_dir)
        if not config:
            raise ExportError(f"{model_dir}: no readable preprocessor_config.json (the image processor's settings)")
        image_size = qwen_processor.image_size(config, image_size)
    elif image_size is not None:
        raise ExportError(f"image size {image_size}: a {model_type} export takes the image size its processor makes")
    else:
        processor = load_processor(AutoProcessor, model_dir, "processor (the image preprocessing and chat template)")
        image_size = _image_size(processor)
    model = load_checkpoint(AutoModelForImageTextToText, model_dir, dtype, "an image-text-to-text model")
    report("load", time.perf_counter() - started)
    started = time.perf_counter()
    text = text_model(model)
    capacity = max_context or min(getattr(text.config, "max_position_embeddings", None) or 2048, 2048)
    causal_lm.with_static_cache(text, capacity)
    encoder = image_program.vision_encoder(model, image_size, embeddings)
    # ExecuTorch's MultimodalRunner prefills an image's embeddings in one call
    per_image = image_program.tokens_per_image(encoder, image_size)  # (before the weights are deferred)
    longest = min(max(max_seq_len, per_image), capacity)
    if embeddings == "marked":
        _refuse_images_past_the_window(text.config, per_image)
    quantized = ()
    if quantize is not None:  # in place: text and encoder hold the model's own modules
        from etmlx.quant.weights import quantize as quantize_weights

        model, quantized = quantize_weights(model, quantize, group_size, deferred=True)
    # Qwen3-VL's deepstack: features of early vision layers, added to the first text layers' outputs
    stacked = len(getattr(model.config.vision_config, "deepstack_visual_indexes", None) or ())
    methods = causal_lm.export_methods(text, longest, capacity, embeddings=embeddings, stacked_features=stacked)
    methods.update(image_program.export_methods(encoder, text, image_size, longest, embeddings, stacked))
    methods["image_token_id"] = int(model.config.image_token_id)
    report("trace", time.perf_counter() - started)
    started = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    result = export_methods(methods, output)
    result.quantized = tuple(quantized)
    report("lower and write", time.perf_counter() - started)
    destination = os.path.dirname(os.path.abspath(output))
    result.tokenizer_files = copy_tokenizer(model_dir, destination, extra=PROCESSOR_FILES)
    if embeddings == "positioned":
        qwen_processor.write_max_pixels(destination, image_size)
    return result


def text_model(model):
    """The causal LM inside ``model``: its language model and head, no copy (built on the
    meta device, then given the checkpoint's modules)."""
    import torch
    import transformers

    config = model.config.get_text_config()
    shell = SHELLS.get(config.model_type)
    with torch.device("meta"):
        if shell:  # (its model is the checkpoint's: built with no layers, which need settings it lacks)
            text = getattr(transformers, shell)(_without_layers(config))
            text.config = config
        else:
            text = transformers.AutoModelForCausalLM.from_config(config)
    text.model, text.lm_head = model.model.get_decoder(), model.lm_head
    text.generation_config = model.generation_config
    return text.eval()


def _without_layers(config):
    """A copy of ``config`` of no layers."""
    empty = copy.copy(config)
    empty.num_hidden_layers, empty.layer_types = 0, []
    return empty


def _refuse_images_past_the_window(config, per_image: int) -> None:
    """A sliding layer lets an image's tokens see the rest of their image only inside its
    window (transformers: the window AND (causal OR block)). etmlx's rings mask so; a
    sliding layer whose window spans the cache keeps transformers' sliding mask, which the
    block is ORed into: the same only while an image fits in the window."""
    window = getattr(config, "sliding_window", None)
    if window is not None and per_image > window:
        raise ExportError(f"{per_image} tokens per image, past the sliding window of {window}: etmlx attends an "
                          "image's tokens to each other only within the window")


def _image_size(processor) -> tuple:
    """(height, width) of the pixel values the checkpoint's image processor makes: its
    tiles when it splits images into square tiles (Idefics3, SmolVLM: every tile, and the
    whole image resized, of ``max_image_size``), its crop when it crops, else its resize."""
    images = processor.image_processor
    tile = _field(getattr(images, "max_image_size", None), "longest_edge")
    if tile:
        return int(tile), int(tile)
    sizes = [getattr(images, "crop_size", None)] if getattr(images, "do_center_crop", False) else []
    for size in sizes + [getattr(images, "size", None)]:
        height, width = (_field(size, name) for name in ("height", "width"))
        if height and width:
            return int(height), int(width)
    raise ExportError(f"{type(images).__name__} makes images of no fixed size ({getattr(images, 'size', None)}): "
                      "etmlx exports vision encoders of one image size")


def _field(size, name):
    return size.get(name) if isinstance(size, dict) else getattr(size, name, None)
