"""``etmlx serve PTE``: the OpenAI-compatible server (``app.py``) on uvicorn."""

import importlib.util
import os
import sys

from etmlx.errors import EtMlxError

NEEDS = ("starlette", "uvicorn", "llguidance", "transformers")


def add_command(commands) -> None:
    from etmlx.llm.cli import _positive, add_draft_options

    serve = commands.add_parser("serve", help="serve a .pte from export-llm over OpenAI's HTTP API "
                                "(/v1/chat/completions, /v1/completions, /v1/models, /health)")
    serve.add_argument("pte", help="a .pte from export-llm")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: "
                       "this machine only)")
    serve.add_argument("--port", type=_port, default=8080, help="default 8080; 0 picks a free port")
    serve.add_argument("--model-name", help="the model's id in requests and /v1/models (default: the .pte's "
                       "folder name, or its file name)")
    serve.add_argument("--max-tokens", type=_positive, default=512,
                       help="tokens a reply may have when its request does not say (default 512)")
    serve.add_argument("--temperature", type=float, default=0.0,
                       help="when a request does not say (default 0: greedy, as etmlx chat)")
    serve.add_argument("--prompt-cache-mib", type=int, default=512, help="memory for the KV caches kept across "
                       "requests, so a conversation's next turn prefills only its new tokens (default 512; 0: none)")
    add_draft_options(serve, "; requests with a grammar or logprobs decode without it")
    serve.add_argument("--runtime", choices=("python", "executorch"), default="python")
    serve.add_argument("--tokenizer", help="tokenizer.json or its folder (default: the .pte's folder)")
    serve.set_defaults(handler=_serve)


def _serve(args) -> int:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise EtMlxError(f"serve needs {', '.join(missing)}, which is not installed: pip install 'etmlx[serve]'")
    import socket

    import uvicorn

    from etmlx import load
    from etmlx.llm.cli import _note_half_precision_on_the_cpu, draft_session
    from etmlx.llm.generation import load_tokenizer
    from .app import make_app
    from .engine import Engine

    for path in (args.pte, args.draft):
        if path and not os.path.isfile(path):
            raise EtMlxError(f"no such file: {path}")
    if args.prompt_cache_mib < 0:
        raise EtMlxError(f"--prompt-cache-mib {args.prompt_cache_mib}: expected 0 or more")
    name = args.model_name or _default_name(args.pte)
    tokenizer_folder = args.tokenizer or os.path.dirname(os.path.abspath(args.pte))
    tokenizer = load_tokenizer(tokenizer_folder)
    draft = None
    if args.draft or args.speculative:
        draft = lambda target: draft_session(args.pte, target, args.draft, args.speculative,  # noqa: E731
                                             args.runtime, tokenizer_folder)
    engine = Engine(lambda: load(args.pte, runtime=args.runtime), tokenizer, name, args.max_tokens,
                    args.prompt_cache_mib << 20, args.temperature, draft, args.num_draft_tokens, tokenizer_folder)
    _note_half_precision_on_the_cpu(args.pte)
    listener = socket.create_server((args.host, args.port))
    host, port = listener.getsockname()[:2]
    print(f"serving {name} at http://{host}:{port}/v1 (context {engine.context} tokens)", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(make_app(engine), log_level="warning")).run(sockets=[listener])
    return 0


def _port(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port, 0 to 65535")
    return int(text)


def _default_name(pte: str) -> str:
    """The folder export-llm wrote to names the model better than its usual model.pte."""
    path = os.path.abspath(pte)
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(os.path.dirname(path)) if stem == "model" else stem
