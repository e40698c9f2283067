"""A LLaVA-shaped model's image encode time and time to first token: etmlx on both
runtimes, transformers eager and mlx-vlm (if installed: `pip install mlx-vlm`), on one
checkpoint folder, in one run.

    python bench/bench_vlm.py [--image-size 224 --patch 16 --repeats 3]

The folder (random weights, float32, written by examples/vision_language.py): a CLIP
ViT-B-shaped tower (hidden 768, 12 layers, 12 heads, MLP 3072; 224 px in 16 px patches:
196 image tokens) and a Llama of hidden 1024, 8 layers (16 heads, 4 key-value heads) with
the tiny trained tokenizer. Encode: pixel values to projected features. Time to first
token: features, the prompt (the image's tokens and a short question) prefilled, the first
token chosen; the processor's preprocessing is done once, outside every timing.
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

        encode = best_of(repeats, lambda: np.asarray(program.run_method("vision_encoder", [pixel_values])[0]))
        rows.append((f"etmlx ({runtime})", encode[0], *best_of(repeats, first_token)))
    return rows


def transformers_row(model, inputs, repeats: int) -> tuple:
    import torch

    with torch.no_grad():
        encode = best_of(repeats, lambda: model.model.get_image_features(pixel_values=inputs["pixel_values"]))
        first = best_of(repeats, lambda: int(model(**inputs, logits_to_keep=1).logits[0, -1].argmax()))
    return ("transformers eager", encode[0], *first)


def as_on_the_hub(folder) -> None:
    """Renames the vision tower's tensors as the Hub's LLaVA checkpoints (and so mlx-vlm)
    name them, ``vision_tower.vision_model.*``: transformers 5 saves them without
    ``vision_model`` and reads both."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    save_file({name.replace("vision_tower.", "vision_tower.vision_model.", 1): tensor
               for name, tensor in tensors.items()}, path, metadata={"format": "pt"})


def mlx_vlm_row(folder, ids, pixel_values, repeats: int) -> tuple:
    import mlx.core as mx
    from mlx_vlm import load
    from mlx_vlm.models.cache import make_prompt_cache

    model, _ = load(folder)
    input_ids, pixels = mx.array([ids]), mx.array(pixel_values.numpy())

    def encode():
        mx.eval(model.get_input_embeddings(input_ids, pixels).inputs_embeds)

    def first_token():
        logits = model(input_ids, pixels, mask=None, cache=make_prompt_cache(model.language_model))
        return int(mx.argmax(logits.logits[0, -1]).item())

    return ("mlx-vlm", best_of(repeats, encode)[0], *best_of(repeats, first_token))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import etmlx
    from etmlx.multimodal.images import image_prompt
    from etmlx.runtime_shim.blas import preload_openblas
    from transformers import AutoModelForImageTextToText

    from examples.vision_language import tiny_llava_checkpoint, write_image

    print(f"{os.cpu_count()} cores; BLAS: {preload_openblas()}; float32")
    try:
        import mlx_vlm  # noqa: F401
    except ImportError:
        mlx_vlm = None
        print("mlx-vlm is not installed (pip install mlx-vlm): its row is left out")
    with tempfile.TemporaryDirectory() as directory:
        folder = tiny_llava_checkpoint(os.path.join(directory, "llava"), image_size=args.image_size, patch=args.patch,
                                       vision=(768, 12, 12, 3072), text=(1024, 8, 16, 4), scale=1.0)
        as_on_the_hub(folder)
        pte = os.path.join(directory, "out", "llava.pte")
        started = time.perf_counter()
        etmlx.export_llm(folder, pte)
        exported = time.perf_counter() - started
        ids, pixel_values = image_prompt(folder, QUESTION, write_image(os.path.join(directory, "image.png")))
        model = AutoModelForImageTextToText.from_pretrained(folder).eval()
        import torch

        inputs = {"input_ids": torch.tensor([ids]), "pixel_values": pixel_values}
        rows = etmlx_rows(pte, ids, pixel_values, args.repeats) + [transformers_row(model, inputs, args.repeats)]
        if mlx_vlm is not None:
            rows.append(mlx_vlm_row(folder, ids, pixel_values, args.repeats))
    print(f"\nLLaVA-shaped: {len(ids)} prompt tokens, exported in {exported:.1f} s")
    print(f"{'':<22}{'encode ms':>11}{'vs etmlx':>10}{'TTFT ms':>10}{'vs etmlx':>10}  first token")
    base = rows[0]
    for name, encode, first, token in rows:
        print(f"{name:<22}{encode * 1e3:>11.1f}{encode / base[1]:>9.2f}x{first * 1e3:>10.1f}"
              f"{first / base[2]:>9.2f}x  {token}")


if __name__ == "__main__":
    main()
