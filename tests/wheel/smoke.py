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


def serve(work: pathlib.Path, etmlx_command: pathlib.Path) -> None:
    """A random tiny Llama and a trained tokenizer, exported and served; one chat reply."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["hello world, a model served from a wheel"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}<s>"
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(work / "llm")
    tokenizer.save_pretrained(work / "llm")
    subprocess.run([str(etmlx_command), "export-llm", str(work / "llm"), "-o", str(work / "served" / "model.pte")],
                   check=True)
    log = work / "serve.log"
    with open(log, "w") as stderr:
        server = subprocess.Popen([str(etmlx_command), "serve", str(work / "served" / "model.pte"), "--port", "0"],
                                  stderr=stderr)
    try:
        for _ in range(600):
            if "serving " in log.read_text() or server.poll() is not None:
                break
            time.sleep(0.1)
        assert "serving served at " in log.read_text(), log.read_text()
        url = log.read_text().split(" at ", 1)[1].split()[0]
        body = json.dumps({"model": "served", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        request = urllib.request.Request(url + "/chat/completions", body.encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        assert reply["usage"]["completion_tokens"] >= 1 and reply["choices"][0]["finish_reason"], reply
        print("etmlx serve: ok", reply["usage"])
    finally:
        server.terminate()
        server.wait(30)


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
