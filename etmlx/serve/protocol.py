"""OpenAI's request bodies, read and checked: every field a request may hold is checked
here, before it reaches the model, and a bad one is a ``RequestError`` that names it (an
HTTP 400 with OpenAI's error body). A field that would change the reply and that this
server does not do is refused by name (``NOT_DONE``); fields that change nothing here
(``user``, ``metadata``, ``store``, ...) are ignored."""

import math
from dataclasses import dataclass, field

from etmlx.errors import EtMlxError
from etmlx.llm.generation import GenerationError, Sampling

ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's fields that change a reply and that this server does not do: refused by name,
# never ignored (a reply that quietly lacks what was asked for is a wrong reply)
NOT_DONE = ("logit_bias", "functions", "function_call", "suffix", "audio", "prediction", "web_search_options")


class RequestError(EtMlxError, ValueError):
    """A request the server refuses: ``status``, and OpenAI's error ``type``, ``param``
    and ``code``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Request:
    """A completion request, checked: ``messages`` (chat) or ``prompt`` (text or ids)."""

    chat: bool
    messages: list | None = None
    prompt: str | list | None = None
    max_tokens: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list | None = None
    tool_choice: object = "auto"
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    echo: bool = False
    images: list = field(default_factory=list)  # the messages' image parts, decoded (PIL), in order

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced_tools(self) -> list:
        """The tools one of which the reply must call (``tool_choice`` "required" or a
        named function); empty when the model may answer in text."""
        if not self.tools or self.tool_choice in ("auto", "none"):
            return []
        if self.tool_choice == "required":
            return self.tools
        return [t for t in self.tools if t["function"]["name"] == self.tool_choice["function"]["name"]]


def chat_request(body, model: str, default_temperature: float) -> Request:
    fields = _Fields(body, model)
    images = []
    request = Request(chat=True, messages=_messages(fields.get("messages", list, required=True), images), images=images)
    _common(fields, request, default_temperature)
    request.logprobs = fields.get("logprobs", bool, default=False)
    request.top_logprobs = fields.integer("top_logprobs", 0, 20, default=0)
    if request.top_logprobs and not request.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    request.max_tokens = fields.integer("max_completion_tokens", 1, None, default=request.max_tokens)
    request.tools = _tools(fields.get("tools", list, default=None))
    request.tool_choice = _tool_choice(fields.get("tool_choice", (str, dict), default="auto"), request.tools)
    request.parallel_tool_calls = fields.get("parallel_tool_calls", bool, default=True)
    request.response_format = _response_format(fields.get("response_format", dict, default=None))
    if request.forced_tools and request.response_format:
        raise RequestError("tool_choice forces a tool call and response_format a JSON reply: ask for one",
                           "response_format")
    return request


def completion_request(body, model: str, default_temperature: float) -> Request:
    fields = _Fields(body, model)
    prompt = fields.get("prompt", (str, list), required=True)
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                for t in prompt):
            raise RequestError("prompt: expected a string or a list of token ids (one prompt per request)", "prompt")
    if not prompt:
        raise RequestError("prompt is empty", "prompt")
    request = Request(chat=False, prompt=prompt)
    _common(fields, request, default_temperature)
    logprobs = fields.integer("logprobs", 0, 5, default=None)
    request.logprobs, request.top_logprobs = logprobs is not None, logprobs or 0
    request.echo = fields.get("echo", bool, default=False)
    if request.echo and request.stream:
        raise RequestError("echo is not supported with stream", "echo")
    return request


def _common(fields, request: Request, default_temperature: float) -> None:
    if fields.integer("n", 1, None, default=1) != 1:
        raise RequestError("n: this server makes one choice per request", "n")
    if fields.integer("best_of", 1, None, default=1) != 1:
        raise RequestError("best_of: this server makes one choice per request", "best_of")
    request.max_tokens = fields.integer("max_tokens", 1, None, default=None)
    request.stream = fields.get("stream", bool, default=False)
    options = fields.get("stream_options", dict, default=None) or {}
    if options and not request.stream:
        raise RequestError("stream_options needs stream: true", "stream_options")
    request.include_usage = options.get("include_usage", False)
    if not isinstance(request.include_usage, bool):
        raise RequestError("stream_options.include_usage: expected true or false", "stream_options")
    stop = fields.get("stop", (str, list), default=None)
    stop = [stop] if isinstance(stop, str) else stop or []
    if len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop: expected a string or up to 4 non-empty strings", "stop")
    request.stop = tuple(stop)
    temperature = fields.number("temperature", 0, 2, default=default_temperature)
    settings = dict(temperature=temperature, top_p=fields.number("top_p", 0, 1, default=1.0),
                    top_k=fields.integer("top_k", 0, None, default=0), min_p=fields.number("min_p", 0, 1, default=0.0),
                    repetition_penalty=fields.number("repetition_penalty", 0, None, default=1.0),
                    frequency_penalty=fields.number("frequency_penalty", -2, 2, default=0.0),
                    presence_penalty=fields.number("presence_penalty", -2, 2, default=0.0),
                    seed=_seed(fields.integer("seed", None, None, default=None)))
    try:
        request.sampling = Sampling(**settings)
    except GenerationError as error:
        name = str(error).split("=", 1)[0]
        raise RequestError(str(error), name) from None


def _seed(seed):
    """OpenAI takes any integer; numpy's generator, one of 0 to 2**64 - 1 (the same seed
    still draws the same tokens)."""
    return None if seed is None else seed % 2**64


class _Fields:
    """A request body's fields, each read with its type checked."""

    def __init__(self, body, model: str):
        if not isinstance(body, dict):
            raise RequestError("the request body is not a JSON object")
        self.body = body
        for name in NOT_DONE:
            if body.get(name) is not None:
                raise RequestError(f"{name} is not supported by this server", name, "unsupported_parameter")
        modalities = body.get("modalities")
        if modalities is not None and modalities != ["text"]:
            raise RequestError("modalities: this server answers in text only", "modalities", "unsupported_parameter")
        requested = body.get("model")
        if requested is not None and requested != model:
            raise RequestError(f"the model {requested!r} does not exist: this server serves {model!r}", "model",
                               "model_not_found")

    def get(self, name: str, kinds, required: bool = False, default=None):
        value = self.body.get(name)
        if value is None:
            if required:
                raise RequestError(f"{name} is required", name)
            return default
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(_TYPE_NAMES[k] for k in kinds)
            raise RequestError(f"{name}: expected {expected}, got {_describe(value)}", name)
        return value

    def number(self, name: str, low, high, default):
        value = self.get(name, (int, float), default=default)
        if value is not None and not (math.isfinite(value) and (low is None or value >= low)
                                      and (high is None or value <= high)):
            raise RequestError(f"{name}={value!r}: expected a number in {_range(low, high)}", name)
        return value

    def integer(self, name: str, low, high, default):
        value = self.get(name, int, default=default)
        if value is not None and not ((low is None or value >= low) and (high is None or value <= high)):
            raise RequestError(f"{name}={value!r}: expected a whole number in {_range(low, high)}", name)
        return value


_TYPE_NAMES = {str: "a string", list: "an array", dict: "an object", bool: "true or false", int: "a whole number",
               float: "a number"}


def _describe(value) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__) + (f" ({value!r})" if isinstance(value, (int, float)) else "")


def _range(low, high) -> str:
    return f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"


def _messages(messages: list, images: list) -> list:
    """The messages as a chat template reads them: text parts joined, a tool call's
    arguments as the object they encode. A message with image parts keeps its parts as a
    processor's template reads them (``{"type": "image"}`` and text), each image decoded
    onto ``images``."""
    if not messages:
        raise RequestError("messages is empty", "messages")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(f"{where}: expected an object with a role ({', '.join(ROLES)})", where)
        content, calls = message.get("content"), message.get("tool_calls")
        if isinstance(content, list):
            content = _content_parts(content, where, images)
        if content is None and message["role"] == "assistant" and calls:
            content = ""
        if not isinstance(content, (str, list)):
            raise RequestError(f"{where}: a {message['role']} message needs content (a string or content parts)",
                               f"{where}.content")
        checked.append({**message, "content": content, **({"tool_calls": _template_calls(calls, where)} if calls else {})})
    return checked


def _content_parts(parts: list, where: str, images: list):
    """Text parts as one string; with image parts, the parts in order."""
    read = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            read.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            images.append(_image(part.get("image_url"), f"{where}.content[{index}]"))
            read.append({"type": "image"})
        else:
            raise RequestError(f"{where}: content part of type {kind!r}: expected text or image_url parts",
                               f"{where}.content")
    if all(part["type"] == "text" for part in read):
        return "".join(part["text"] for part in read)
    return read


def _image(image_url, where: str):
    """An ``image_url`` part's image (RGB, Pillow): a ``data:`` URL of base64 bytes, as
    OpenAI's clients send a local image; the server fetches nothing."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    url = image_url.get("url") if isinstance(image_url, dict) else None
    if not isinstance(url, str) or not url.startswith("data:"):
        raise RequestError(f"{where}: expected an image_url whose url is a data: URL of base64 image bytes (this "
                           "server fetches nothing)", where)
    header, _, data = url.partition(",")
    try:
        if not header.endswith(";base64"):
            raise ValueError("not base64")
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as image:
            return image.convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as error:
        raise RequestError(f"{where}: the data: URL holds no image Pillow can decode ({error})", where) from None


def _template_calls(calls, where: str) -> list:
    import json

    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls: expected an array", f"{where}.tool_calls")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}.tool_calls: each needs a function with a name", f"{where}.tool_calls")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise RequestError(f"{where}.tool_calls: arguments are not JSON", f"{where}.tool_calls") from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def _tools(tools) -> list | None:
    if tools is None:
        return None
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{index}]: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               f"tools[{index}]")
        if not isinstance(function.get("parameters", {}), dict):
            raise RequestError(f"tools[{index}].function.parameters: expected a JSON schema object",
                               f"tools[{index}]")
    return tools or None


def _tool_choice(choice, tools):
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise RequestError(f"tool_choice={choice!r}: expected auto, none, required or a function", "tool_choice")
        if choice == "required" and not tools:
            raise RequestError("tool_choice is required but no tools are given", "tool_choice")
        return choice
    name = choice.get("function", {}).get("name") if choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise RequestError('tool_choice: expected {"type": "function", "function": {"name": ...}}', "tool_choice")
    if not any(t["function"]["name"] == name for t in tools or []):
        raise RequestError(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return choice


def _response_format(value) -> dict | None:
    kind = value.get("type") if value else "text"
    if kind == "text":
        return None
    if kind == "json_object":
        return {"schema": None}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise RequestError('response_format: json_schema needs {"name": ..., "schema": {...}}', "response_format")
        return {"schema": spec.get("schema", {})}
    raise RequestError(f"response_format type {kind!r}: expected text, json_object or json_schema", "response_format")
