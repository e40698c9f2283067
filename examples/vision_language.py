"""Tiny vision-language checkpoint folders as users have them (config, safetensors,
tokenizer, the processor's image preprocessing and chat template), random weights, and an
image to ask about: what the vision-language tests and the README's walk-through export.
LLaVA (one image, one encoder call), Idefics3 (an image split into tiles, an encoder
call each: SmolVLM's architecture), Gemma 3 (an image's tokens attend to the whole image)
and Qwen2.5-VL (positions in three dimensions; Qwen2-VL and Qwen3-VL by the same builder).

    python examples/vision_language.py /tmp/llava             # writes the folder and /tmp/llava/image.png
    python examples/vision_language.py /tmp/idefics3 idefics3   # or gemma3, qwen2_5_vl, qwen3_vl
"""

import os
import sys

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

from llm import train_tokenizer  # noqa: E402

IMAGE_SIZE, PATCH = 30, 6  # 25 patches: 25 image tokens per image
# One user turn's content is a string or a list of image and text parts.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</s>{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def tiny_llava_checkpoint(directory, seed: int = 0, image_size: int = IMAGE_SIZE, patch: int = PATCH,
                          vision: tuple = (32, 2, 2, 64), text: tuple = (64, 2, 4, 2), scale: float = 4.0,
                          tower: str = "clip") -> str:
    """Writes a LLaVA folder (a CLIP vision tower of ``image_size`` pixels square in
    ``patch``-pixel patches, a Llama) into ``directory``. ``vision``: (hidden, layers,
    heads, MLP width); ``text``: (hidden, layers, heads, key-value heads); weights scaled by ``scale``
    (4: greedy text varies). ``tower="siglip"``: a SigLIP tower (no class token, so every
    patch's features; its pooling head, which LLaVA does not read, kept as checkpoints have it)."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor, SiglipImageProcessorPil,
                              SiglipVisionConfig)

    tokenizer = train_tokenizer(128)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    (vision_hidden, vision_layers, vision_heads, vision_mlp), (hidden, layers, heads, kv_heads) = vision, text
    sizes = dict(hidden_size=vision_hidden, intermediate_size=vision_mlp, num_hidden_layers=vision_layers,
                 num_attention_heads=vision_heads, image_size=image_size, patch_size=patch)
    if tower == "clip":
        vision_config, selection, class_tokens = CLIPVisionConfig(**sizes, projection_dim=vision_hidden), "default", 1
        images = CLIPImageProcessor(size={"shortest_edge": image_size},
                                    crop_size={"height": image_size, "width": image_size})
    else:
        vision_config, selection, class_tokens = SiglipVisionConfig(**sizes), "full", 0
        images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    text_config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                              max_position_embeddings=max(256, 2 * (image_size // patch) ** 2))
    config = LlavaConfig(vision_config=vision_config, text_config=text_config,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-2,
                         vision_feature_select_strategy=selection, image_seq_length=(image_size // patch) ** 2)
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=patch,
                               vision_feature_select_strategy=selection, chat_template=CHAT_TEMPLATE,
                               num_additional_image_tokens=class_tokens)
    return _saved(LlavaForConditionalGeneration, config, processor, directory, seed, scale)


def tiny_idefics3_checkpoint(directory, seed: int = 0, tile: int = 32, patch: int = 8, scale: float = 4.0,
                             family: str = "Idefics3") -> str:
    """Writes an Idefics3 folder into ``directory``: a SigLIP-like vision model of
    ``tile``-pixel square tiles in ``patch``-pixel patches, a pixel-shuffle connector (by 2),
    a Llama; its processor splits an image into tiles of ``tile`` pixels (at most 2 x 2,
    then the whole image, resized) and marks each tile's placeholders with its row and
    column. Weights scaled by ``scale``. ``family="SmolVLM"``: SmolVLM's classes (the same
    architecture) with the same processor (SmolVLM's own needs num2words and torchvision)."""
    import transformers
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor, LlamaConfig

    tokenizer = train_tokenizer(128)
    tiles = [f"<row_{row}_col_{column}>" for row in range(1, 7) for column in range(1, 7)]
    tokenizer.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>",
                                                                "<end_of_utterance>", "<global-img>", *tiles]})
    vision = getattr(transformers, f"{family}VisionConfig")(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                             num_attention_heads=2, image_size=tile, patch_size=patch)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config = getattr(transformers, f"{family}Config")(vision_config=vision, text_config=text, scale_factor=2,
                                                     image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    images = Idefics3ImageProcessorPil(size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile})
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
                                  image_seq_len=(tile // patch) ** 2 // 4)
    return _saved(getattr(transformers, f"{family}ForConditionalGeneration"), config, processor, directory, seed, scale)


def tiny_gemma3_checkpoint(directory, seed: int = 4, image_size: int = 32, patch: int = 8, scale: float = 4.0) -> str:
    """Writes a Gemma 3 folder into ``directory``: a SigLIP tower of ``image_size`` pixels
    in ``patch``-pixel patches, pooled to 4 tokens an image, whose tokens attend to their
    whole image in the text model (its block mask); a Gemma 3 text model of a sliding layer
    (window 16) and a full one. Weights scaled by ``scale``; seed 4's greedy text varies with
    the image (others' repeat a token)."""
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil,
                              Gemma3Processor, Gemma3TextConfig, PreTrainedTokenizerFast, SiglipVisionConfig)

    trained = train_tokenizer(128)
    named = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    trained.add_special_tokens({"additional_special_tokens": list(named.values())})
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=trained.backend_tokenizer, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", extra_special_tokens=named)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                image_size=image_size, patch_size=patch, vision_use_head=False)  # as Gemma 3's
    layer_types = ["sliding_attention", "full_attention"]
    text = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                            sliding_window=16, layer_types=layer_types, query_pre_attn_scalar=16)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in named.items()}
    config = Gemma3Config(vision_config=vision, text_config=text, mm_tokens_per_image=4,
                          image_token_id=ids["image_token"], boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"])
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size}),
                                tokenizer=tokenizer, chat_template=CHAT_TEMPLATE.replace("<image>", named["boi_token"]),
                                image_seq_length=4)
    return _saved(Gemma3ForConditionalGeneration, config, processor, directory, seed, scale, zeros=1.0)


def tiny_qwen2_5_vl_checkpoint(directory, seed: int = 0, patch: int = 4, scale: float = 4.0,
                               family: str = "Qwen2_5_VL", vision: tuple = (32, 2, 2, 64),
                               text: tuple = (64, 2, 4, 2), largest: int = 8) -> str:
    """Writes a Qwen2.5-VL folder into ``directory``: a vision transformer of
    ``patch``-pixel patches merged 2 x 2, attending within windows of 4 x 4 patches but in
    its last layer (images of 4 x 4 to ``largest`` x ``largest`` patches: 32 x 32 pixels is
    16 merged patches, 16 tokens); a Qwen2.5-VL text model whose rotary positions run in
    three dimensions (multimodal RoPE). ``vision``: (hidden, layers, heads, MLP width);
    ``text``: (hidden, layers, heads, key-value heads). The folder holds what a Qwen2.5-VL
    repository does: the tokenizer, the image processor's config and ``chat_template.json``
    (transformers' Qwen2_5_VLProcessor itself also builds a video processor, which needs
    torchvision). Weights scaled by ``scale``. ``family="Qwen2VL"``: Qwen2-VL's classes
    (its vision transformer attends over the whole image); ``"Qwen3VL"``: Qwen3-VL's (a
    learned position grid of 4 x 4 resampled to the image's, and deepstack layers, whose
    features enter the first text layers: the first two layers of a tiny tower, three
    spread over a deeper one); ``"Qwen3VLMoe"``: the same with a text model of 4 experts."""
    import json

    import transformers
    from transformers import Qwen2VLImageProcessorPil

    tokenizer = train_tokenizer(128)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
                                                                "<|video_pad|>"]})
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("<|vision_start|>", "<|image_pad|>",
                                                                       "<|vision_end|>", "<|video_pad|>")}
    (vision_hidden, depth, vision_heads, vision_mlp), (hidden, layers, heads, kv_heads) = vision, text
    eighth = hidden // heads // 16  # mrope_section: the rotary pairs of time, height, width (Qwen: 16, 24, 24 of 64)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2 * eighth, 3 * eighth, 3 * eighth]}
    vision_sizes = dict(depth=depth, num_heads=vision_heads, patch_size=patch, spatial_merge_size=2,
                        temporal_patch_size=2)
    text_sizes = {}
    if family == "Qwen2VL":
        vision_sizes.update(embed_dim=vision_hidden, hidden_size=hidden, mlp_ratio=vision_mlp // vision_hidden)
    elif family.startswith("Qwen3VL"):  # a learned position grid of 4 x 4, resampled to the image's
        deepstack = [0, 1] if depth <= 2 else [depth // 4 - 1, depth // 2 - 1, 3 * depth // 4 - 1]
        vision_sizes.update(hidden_size=vision_hidden, intermediate_size=vision_mlp, out_hidden_size=hidden,
                            num_position_embeddings=16, deepstack_visual_indexes=deepstack)
        text_sizes.update(head_dim=hidden // heads, rope_parameters={**rope, "mrope_interleaved": True})
        if family == "Qwen3VLMoe":
            text_sizes.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden // 2)
    else:
        vision_sizes.update(hidden_size=vision_hidden, intermediate_size=vision_mlp, out_hidden_size=hidden,
                            window_size=4 * patch, fullatt_block_indexes=[depth - 1])
    text_sizes = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      **{"rope_parameters": rope, **text_sizes})
    config = getattr(transformers, f"{family}Config")(
        vision_config=vision_sizes, text_config=text_sizes, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"])
    pixels = {"shortest_edge": 16 * patch ** 2, "longest_edge": largest ** 2 * patch ** 2}
    images = Qwen2VLImageProcessorPil(size=pixels, patch_size=patch, merge_size=2, temporal_patch_size=2)
    template = CHAT_TEMPLATE.replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")
    tokenizer.chat_template = template  # as Qwen2.5-VL's tokenizer_config.json holds it too
    _saved(getattr(transformers, f"{family}ForConditionalGeneration"), config, tokenizer, directory, seed, scale)
    images.save_pretrained(directory)
    with open(os.path.join(directory, "chat_template.json"), "w") as f:
        json.dump({"chat_template": template}, f)
    return str(directory)


def _saved(model_class, config, processor, directory, seed: int, scale: float, zeros=None) -> str:
    """``directory`` holding a ``model_class`` of ``config`` (random weights times
    ``scale``: greedy text varies) and ``processor``. ``zeros``: the spread of the weights
    the model's init leaves at zero (Gemma 3's norms, which scale by 1 + weight, and its
    image projection: left so, greedy text repeats and every image is alike)."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if zeros and name.endswith("weight") and not parameter.any():
                parameter.normal_(0, zeros)
            else:
                parameter.mul_(scale)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return str(directory)


def write_image(path, seed: int = 0, size=(40, 52)) -> str:
    """A random RGB image, saved in the format its suffix names."""
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((*size, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return str(path)


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else "llava-tiny-random"
    builders = {"llava": tiny_llava_checkpoint, "idefics3": tiny_idefics3_checkpoint, "gemma3": tiny_gemma3_checkpoint,
                "qwen2_5_vl": tiny_qwen2_5_vl_checkpoint,
                "qwen3_vl": lambda folder: tiny_qwen2_5_vl_checkpoint(folder, family="Qwen3VL")}
    builders[sys.argv[2] if len(sys.argv) > 2 else "llava"](folder)
    print(f"wrote {folder} and {write_image(os.path.join(folder, 'image.png'))}")
