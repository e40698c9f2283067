"""A vision-language model's image encode time and time to first token: etmlx on both
runtimes, transformers eager and mlx-vlm (if installed: `pip install mlx-vlm`), on one
checkpoint folder, in one run.

    python bench/bench_vlm.py [--family llava|qwen3_vl --image-size 224 --patch 16 --repeats 3]

The folder (random weights, float32, written by examples/vision_language.py) holds a
ViT-B-shaped vision tower (hidden 768, 12 layers, 12 heads, MLP 3072) and a text model of
hidden 1024, 8 layers (16 heads, 4 key-value heads) with the tiny trained tokenizer:
``llava``, a CLIP tower and a Llama, 224 px in 16 px patches (196 image tokens);
``qwen3_vl``, Qwen3-VL's (deepstack from 3 of its layers, multimodal RoPE), 448 px in 16 px
patches merged 2 x 2 (196 image tokens). Encode: pixel values to the features the text
model takes. Time to first token: features, the prompt (the image's tokens and a short
question) prefilled, the first token chosen; the processor's preprocessing is done once,
outside every timing.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from timing import best_of  # noqa: E402

QUESTION = "What is in this picture?"


def etmlx_rows(pte, ids, pixel_values, repeats: int) -> list:
    import etmlx
    from etmlx.llm.generation import Session
    from etmlx.multimodal.images import PromptImages

    rows = []
    for runtime in etmlx.RUNTIMES:
        program = etmlx.load(pte, runtime=runtime)

        def first_token():
            session = Session(program)
            session.images = PromptImages(program, pixel_values, ids)
            return int(np.argmax(session.feed(ids)))

        image = pixel_values[0][None]  # [1, 3, H, W]
        encode = best_of(repeats, lambda: np.asarray(program.run_method("vision_encoder", [image])[0]))
        rows.append((f"etmlx ({runtime})", encode[0], *best_of(repeats, first_token)))
    return rows


def transformers_row(model, inputs: dict, repeats: int) -> tuple:
    """``inputs``: the processor's tensors for transformers' model (the image's and the prompt's)."""
    import torch

    image = {name: inputs[name] for name in ("pixel_values", "image_grid_thw") if name in inputs}
    with torch.no_grad():
        encode = best_of(repeats, lambda: model.model.get_image_features(**image))
        first = best_of(repeats, lambda: int(model(**inputs, logits_to_keep=1).logits[0, -1].argmax()))
    return ("transformers eager", encode[0], *first)


def as_on_the_hub(folder, family: str) -> None:
    """Writes ``folder`` as the Hub's checkpoints of ``family`` are (and so as mlx-vlm reads
    them; transformers 5 reads both forms): LLaVA's vision tensors named
    ``vision_tower.vision_model.*``, which transformers 5 saves without ``vision_model``;
    Qwen3-VL's config with the text model's ``rope_theta`` and ``rope_scaling`` and its
    vision config's ``model_type`` ``qwen3_vl``, where transformers 5 writes
    ``rope_parameters`` and ``qwen3_vl_vision``."""
    import json

    if family == "qwen3_vl":
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            config = json.load(f)
        rope = config["text_config"]["rope_parameters"]
        config["text_config"].update(rope_theta=rope["rope_theta"],
                                     rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"})
        config["vision_config"]["model_type"] = "qwen3_vl"
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
        return
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    save_file({name.replace("vision_tower.", "vision_tower.vision_model.", 1): tensor
               for name, tensor in tensors.items()}, path, metadata={"format": "pt"})


def mlx_vlm_row(folder, ids, inputs: dict, repeats: int) -> tuple:
    """mlx-vlm's model of ``folder`` (its processor is not loaded: Qwen's needs
    torchvision) on the processor's ``inputs``, as transformers takes them."""
    from pathlib import Path

    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache
    from mlx_vlm.utils import load_model

    model = load_model(Path(folder))
    input_ids, pixels = mx.array([ids]), mx.array(inputs["pixel_values"].numpy())
    grid = {"image_grid_thw": mx.array(inputs["image_grid_thw"].numpy())} if "image_grid_thw" in inputs else {}

    def encode():
        mx.eval(model.get_input_embeddings(input_ids, pixels, **grid).inputs_embeds)

    def first_token():
        logits = model(input_ids, pixels, mask=None, cache=make_prompt_cache(model.language_model), **grid)
        return int(mx.argmax(logits.logits[0, -1]).item())

    return ("mlx-vlm", best_of(repeats, encode)[0], *best_of(repeats, first_token))


def write_folder(folder, family: str, image_size: int, patch: int) -> str:
    """The benchmark's checkpoint folder of ``family`` (the module docstring's shapes)."""
    from examples.vision_language import tiny_llava_checkpoint, tiny_qwen2_5_vl_checkpoint

    vision, text = (768, 12, 12, 3072), (1024, 8, 16, 4)
    if family == "qwen3_vl":
        folder = tiny_qwen2_5_vl_checkpoint(folder, patch=patch, family="Qwen3VL", vision=vision, text=text,
                                            largest=image_size // patch, scale=1.0)
    else:
        folder = tiny_llava_checkpoint(folder, image_size=image_size, patch=patch, vision=vision, text=text, scale=1.0)
    as_on_the_hub(folder, family)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=("llava", "qwen3_vl"), default="llava")
    parser.add_argument("--image-size", type=int, help="pixels a side (default: 224 for llava, 448 for qwen3_vl)")
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    image_size = args.image_size or (448 if args.family == "qwen3_vl" else 224)

    import etmlx
    from etmlx.multimodal.images import load_processor, read_image
    from etmlx.runtime_shim.blas import preload_openblas
    from transformers import AutoModelForImageTextToText

    from examples.vision_language import write_image

    print(f"{os.cpu_count()} cores; BLAS: {preload_openblas()}; float32")
    try:
        import mlx_vlm  # noqa: F401
    except ImportError:
        mlx_vlm = None
        print("mlx-vlm is not installed (pip install mlx-vlm): its row is left out")
    with tempfile.TemporaryDirectory() as directory:
        folder = write_folder(os.path.join(directory, args.family), args.family, image_size, args.patch)
        pte = os.path.join(directory, "out", f"{args.family}.pte")
        started = time.perf_counter()
        etmlx.export_llm(folder, pte, **({"image_size": image_size} if args.family == "qwen3_vl" else {}))
        exported = time.perf_counter() - started
        processor = load_processor(os.path.dirname(pte))  # (Qwen's: at the export's image size)
        image = read_image(write_image(os.path.join(directory, "image.png"), size=(image_size, image_size)))
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        inputs = dict(processor(images=[image], text=processor.apply_chat_template(turn, add_generation_prompt=True),
                                return_tensors="pt", add_special_tokens=False))
        pixel_values = inputs.pop("pixel_rows", inputs["pixel_values"])  # what etmlx's vision_encoder takes
        ids = inputs["input_ids"][0].tolist()
        model = AutoModelForImageTextToText.from_pretrained(folder).eval()
        rows = etmlx_rows(pte, ids, pixel_values, args.repeats) + [transformers_row(model, inputs, args.repeats)]
        if mlx_vlm is not None:
            rows.append(mlx_vlm_row(folder, ids, inputs, args.repeats))
    print(f"\n{args.family}-shaped: {len(ids)} prompt tokens, exported in {exported:.1f} s")
    print(f"{'':<22}{'encode ms':>11}{'vs etmlx':>10}{'TTFT ms':>10}{'vs etmlx':>10}  first token")
    base = rows[0]
    for name, encode, first, token in rows:
        print(f"{name:<22}{encode * 1e3:>11.1f}{encode / base[1]:>9.2f}x{first * 1e3:>10.1f}"
              f"{first / base[2]:>9.2f}x  {token}")


if __name__ == "__main__":
    main()
