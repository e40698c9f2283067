"""``etmlx serve`` started as a user starts it, for the tests that talk to it over HTTP."""

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


@contextlib.contextmanager
def serving(pte, *options):
    """``etmlx serve PTE --port 0`` (replies of at most 16 tokens unless a request says,
    the model named "tiny"); its base URL while the block runs."""
    log = pte.parent / f"serve{len(os.listdir(pte.parent))}.log"
    etmlx_command = os.path.join(os.path.dirname(sys.executable), "etmlx")
    with open(log, "w") as stderr:
        server = subprocess.Popen([etmlx_command, "serve", str(pte), "--port", "0", "--max-tokens", "16",
                                   "--model-name", "tiny", *options], stderr=stderr)
    try:
        yield _wait_for_url(log, server)
    finally:
        server.terminate()
        server.wait(30)


def post(url: str, body, route: str = "/chat/completions") -> tuple:
    """(HTTP status, JSON reply) of ``body`` (an object, or raw bytes) posted to ``route``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + route, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def image_part(image) -> dict:
    """An OpenAI ``image_url`` content part carrying ``image`` (Pillow) as a PNG data: URL,
    as clients send a local image."""
    import base64
    import io

    png = io.BytesIO()
    image.save(png, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}}


def health(url: str) -> dict:
    """What ``/health`` says of the server at ``url`` (its ``/v1`` base)."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=30) as response:
        return json.loads(response.read())


def _wait_for_url(log, server) -> str:
    for _ in range(600):
        text = log.read_text()
        if "serving " in text:
            return text.split(" at ", 1)[1].split()[0]
        assert server.poll() is None, text
        time.sleep(0.1)
    raise AssertionError(f"the server did not start: {log.read_text()}")
