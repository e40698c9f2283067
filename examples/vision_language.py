"""A tiny LLaVA checkpoint folder as users have one (config, safetensors, tokenizer, the
processor's image preprocessing and chat template), random weights, and an image to ask
about: what the vision-language tests and the README's walk-through export.

    python examples/vision_language.py /tmp/llava   # writes the folder and /tmp/llava/image.png
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
                          vision: tuple = (32, 2, 2, 64), text: tuple = (64, 2, 4, 2), scale: float = 4.0) -> str:
    """Writes a LLaVA folder (a CLIP vision tower of ``image_size`` pixels square in
    ``patch``-pixel patches, a Llama) into ``directory``. ``vision``: (hidden, layers,
    heads, MLP width); ``text``: (hidden, layers, heads, key-value heads); weights scaled by ``scale``
    (4: greedy text varies)."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tokenizer = train_tokenizer(128)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    (vision_hidden, vision_layers, vision_heads, vision_mlp), (hidden, layers, heads, kv_heads) = vision, text
    vision_config = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=vision_mlp,
                                     num_hidden_layers=vision_layers, num_attention_heads=vision_heads,
                                     image_size=image_size, patch_size=patch, projection_dim=vision_hidden)
    text_config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                              max_position_embeddings=max(256, 2 * (image_size // patch) ** 2))
    config = LlavaConfig(vision_config=vision_config, text_config=text_config,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-2,
                         vision_feature_select_strategy="default", image_seq_length=(image_size // patch) ** 2)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(scale)
    images = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=patch,
                               vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                               num_additional_image_tokens=1)
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
    tiny_llava_checkpoint(folder)
    print(f"wrote {folder} and {write_image(os.path.join(folder, 'image.png'))}")
