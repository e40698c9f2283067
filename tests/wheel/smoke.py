"""Run inside a fresh venv holding only the etmlx wheel and its dependencies
(`make test-wheel`): what a user who installs with pip gets. Exports a model through
every stage (attention kept whole by the fused-call retargeting, a quantized layer),
runs it on the Python runtime, checks the error before the native backend is built,
builds it from the installed package (`etmlx build-native`) and runs it on ExecuTorch's
C++ runtime; then, with the ``serve`` extra, exports a tiny language model and asks
``etmlx serve`` for a chat reply over HTTP; exports a tiny Whisper checkpoint
(``examples/speech.py`` of the checkout) and transcribes a WAV file with it, and a tiny
LLaVA (``examples/vision_language.py``) and asks it about an image. Not collected by
pytest: it needs that venv."""

import json
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

import etmlx
from etmlx.inspection import inspect_program


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = self.qkv(x).view(1, -1, 3, 4, 16).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(1, -1, 64))


def main() -> int:
    installed = pathlib.Path(etmlx.__file__).resolve()
    assert pathlib.Path(sys.prefix).resolve() in installed.parents, f"etmlx imported from {installed}, not this venv"

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 8, 64)
    with torch.no_grad():
        expected = model(x)
    work = pathlib.Path(tempfile.mkdtemp())
    path = work / "block.pte"
    result = etmlx.export(model, (x,), path, quantize="int8", group_size=32)
    assert result.report.fully_delegated, result.report.to_text()
    nodes = {n for d in inspect_program(str(path))["methods"]["forward"]["delegates"] for n in d["nodes"]}
    assert {"Sdpa", "QuantizedMatmul"} <= nodes, nodes
    tolerance = dict(atol=2e-2, rtol=2e-2)  # int8 weights against the float model
    torch.testing.assert_close(etmlx.load(path).forward(x), expected, **tolerance)
    print("python runtime: ok", sorted(nodes))

    try:
        etmlx.load(path, runtime="executorch")
    except etmlx.EtMlxError as error:
        assert "etmlx build-native" in str(error), error
        print("before the build:", error)
    else:
        raise AssertionError("the native backend loaded before `etmlx build-native` ran")

    etmlx_command = pathlib.Path(sys.executable).parent / "etmlx"
    subprocess.run([str(etmlx_command), "build-native"], check=True)
    native = etmlx.load(path, runtime="executorch")
    torch.testing.assert_close(native.forward(x), etmlx.load(path).forward(x), atol=1e-5, rtol=1e-5)
    print("executorch runtime: ok")
    serve(work, etmlx_command)
    transcribe(work, etmlx_command)
    ask_about_an_image(work, etmlx_command)
    return 0


def ask_about_an_image(work: pathlib.Path, etmlx_command: pathlib.Path) -> None:
    examples = pathlib.Path(__file__).resolve().parents[2] / "examples"
    subprocess.run([sys.executable, str(examples / "vision_language.py"), str(work / "llava")], check=True)
    subprocess.run([str(etmlx_command), "export-llm", str(work / "llava"), "-o", str(work / "vlm" / "llava.pte")],
                   check=True)
    for runtime in ("python", "executorch"):
        done = subprocess.run([str(etmlx_command), "generate", str(work / "vlm" / "llava.pte"), "--image",
                               str(work / "llava" / "image.png"), "--prompt", "what is it?", "--max-new-tokens", "8",
                               "--runtime", runtime], capture_output=True, text=True, check=True)
        assert "generated 8" in done.stderr or "(eos)" in done.stderr, done.stderr
        print(f"etmlx generate --image ({runtime}): ok", repr(done.stdout.strip()))


def exported_example(work: pathlib.Path, etmlx_command: pathlib.Path, script: str, name: str) -> pathlib.Path:
    """The checkpoint folder ``examples/<script>`` writes into ``work/name``, exported by
    ``etmlx export-llm``: the .pte's path."""
    examples = pathlib.Path(__file__).resolve().parents[2] / "examples"
    subprocess.run([sys.executable, str(examples / script), str(work / name)], check=True)
    pte = work / f"{name}-exported" / f"{name}.pte"
    subprocess.run([str(etmlx_command), "export-llm", str(work / name), "-o", str(pte)], check=True)
    return pte


def transcribe(work: pathlib.Path, etmlx_command: pathlib.Path) -> None:
    pte = exported_example(work, etmlx_command, "speech.py", "whisper")
    for runtime in ("python", "executorch"):
        done = subprocess.run([str(etmlx_command), "transcribe", str(pte), str(work / "whisper" / "speech.wav"),
                               "--language", "en", "--max-new-tokens", "8", "--runtime", runtime],
                              capture_output=True, text=True, check=True)
        assert done.stdout.strip(), done.stderr
        print(f"etmlx transcribe ({runtime}): ok", repr(done.stdout.strip()))


def ask_about_an_image(work: pathlib.Path, etmlx_command: pathlib.Path) -> None:
    pte = exported_example(work, etmlx_command, "vision_language.py", "llava")
    for runtime in ("python", "executorch"):
        done = subprocess.run([str(etmlx_command), "generate", str(pte), "--image", str(work / "llava" / "image.png"),
                               "--prompt", "what is it?", "--max-new-tokens", "8", "--runtime", runtime],
                              capture_output=True, text=True, check=True)
        assert "generated 8" in done.stderr or "(eos)" in done.stderr, done.stderr
        print(f"etmlx generate --image ({runtime}): ok", repr(done.stdout.strip()))


if __name__ == "__main__":
    sys.exit(main())
