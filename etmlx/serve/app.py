"""The HTTP side of ``etmlx serve``: OpenAI's routes on Starlette (run by uvicorn).

Starlette rather than FastAPI: FastAPI's gain is pydantic models that validate bodies
and describe them in an OpenAPI page; here every field's check must answer in
OpenAI's error shape with OpenAI's parameter names (``protocol.py`` does that), so
pydantic would be a second validator to translate, and a dependency more.

A request's job runs on the engine's worker thread; its events come back to the event
loop through an asyncio queue. A client that goes away (a closed stream, or a dropped
connection while it waits for a whole reply) cancels its job.
"""

import asyncio
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .engine import Engine, Failed, Finished, Piece
from .protocol import RequestError, chat_request, completion_request


def make_app(engine: Engine) -> Starlette:
    started = int(time.time())

    async def health(_):
        return JSONResponse({"status": "ok", "model": engine.name, "queued": engine.jobs.qsize(), **engine.counts})

    async def models(_):
        return JSONResponse({"object": "list", "data": [
            {"id": engine.name, "object": "model", "created": started, "owned_by": "etmlx"}]})

    async def chat_completions(http: HttpRequest):
        return await _complete(engine, http, chat_request)

    async def completions(http: HttpRequest):
        return await _complete(engine, http, completion_request)

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    handlers = {RequestError: _refused, 404: _not_found, 405: _not_allowed, Exception: _failed}
    return Starlette(routes=routes, exception_handlers=handlers)


async def _complete(engine: Engine, http: HttpRequest, parse) -> Response:
    try:
        body = json.loads(await http.body())
    except ValueError:
        raise RequestError("the request body is not valid JSON") from None
    request = parse(body, engine.name, engine.temperature)
    loop, events = asyncio.get_running_loop(), asyncio.Queue()
    job = engine.prepare(request, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
    engine.submit(job)
    reply = _Reply(engine.name, request, job.ids)
    if request.stream:
        return StreamingResponse(_stream(reply, events, job), media_type="text/event-stream")
    waiting = asyncio.create_task(_gather(reply, events))
    gone = asyncio.create_task(_disconnected(http))
    try:
        await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not waiting.done():
        job.cancelled.set()
        waiting.cancel()
        return Response(status_code=499)
    return JSONResponse(waiting.result())


async def _gather(reply, events: asyncio.Queue) -> dict:
    while True:
        event = await events.get()
        if isinstance(event, Failed):
            raise event.error
        reply.add(event)
        if isinstance(event, Finished):
            return reply.whole()


async def _stream(reply, events: asyncio.Queue, job):
    try:
        yield _sse(reply.chunk(role=True))
        while True:
            event = await events.get()
            if isinstance(event, Failed):
                yield _sse(_error_body(event.error))
                break
            for chunk in reply.chunks(event):
                yield _sse(chunk)
            if isinstance(event, Finished):
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # a no-op once finished; stops a generation whose client left


async def _disconnected(http: HttpRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _Reply:
    """One request's response, whole or as stream chunks, in OpenAI's shapes."""

    def __init__(self, model: str, request, ids: list):
        self.request, self.ids = request, ids
        kind = "chatcmpl" if request.chat else "cmpl"
        self.head = {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
        self.text, self.logprobs, self.finished = [], [], None

    def add(self, event) -> None:
        if isinstance(event, Piece):
            self.text.append(event.text)
            self.logprobs.extend(event.logprobs)
        else:
            self.finished = event

    def whole(self) -> dict:
        text, finished = "".join(self.text), self.finished
        if self.request.chat:
            message = {"role": "assistant", "content": text or (None if finished.tool_calls else "")}
            if finished.tool_calls:
                message["tool_calls"] = finished.tool_calls
            choice = {"index": 0, "message": message, "logprobs": self._chat_logprobs(self.logprobs),
                      "finish_reason": finished.finish_reason}
            return {**self.head, "object": "chat.completion", "choices": [choice], "usage": finished.usage}
        if self.request.echo:
            text = (self.request.prompt if isinstance(self.request.prompt, str) else "") + text
        choice = {"index": 0, "text": text, "logprobs": self._text_logprobs(self.logprobs),
                  "finish_reason": finished.finish_reason}
        return {**self.head, "object": "text_completion", "choices": [choice], "usage": finished.usage}

    def chunks(self, event) -> list:
        if isinstance(event, Piece):
            return [self.chunk(text=event.text, logprobs=event.logprobs)]
        out = []
        if event.tool_calls:
            calls = [{"index": i, **call} for i, call in enumerate(event.tool_calls)]
            out.append(self.chunk(tool_calls=calls))
        out.append(self.chunk(finish_reason=event.finish_reason))
        if self.request.include_usage:
            out.append({**self._chunk_head(), "choices": [], "usage": event.usage})
        return out

    def chunk(self, text=None, logprobs=(), role=False, tool_calls=None, finish_reason=None) -> dict:
        if not self.request.chat:
            choice = {"index": 0, "text": text or "", "logprobs": self._text_logprobs(logprobs),
                      "finish_reason": finish_reason}
            return {**self._chunk_head(), "choices": [choice]}
        delta = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice = {"index": 0, "delta": delta, "logprobs": self._chat_logprobs(logprobs), "finish_reason": finish_reason}
        return {**self._chunk_head(), "choices": [choice]}

    def _chunk_head(self) -> dict:
        return {**self.head, "object": "chat.completion.chunk" if self.request.chat else "text_completion"}

    def _chat_logprobs(self, entries) -> dict | None:
        if not self.request.logprobs or not entries:
            return None
        return {"content": list(entries)}

    def _text_logprobs(self, entries) -> dict | None:
        if not self.request.logprobs or not entries:
            return None
        offsets, at = [], 0
        for entry in entries:
            offsets.append(at)
            at += len(entry["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}


def _error_body(error: Exception) -> dict:
    if isinstance(error, RequestError):
        return error.body()
    return {"error": {"message": f"{type(error).__name__}: {error}", "type": "server_error", "param": None,
                      "code": None}}


async def _refused(_, error: RequestError):
    return JSONResponse(error.body(), status_code=error.status)


async def _not_found(http, _):
    return JSONResponse(RequestError(f"no route {http.url.path}", code="not_found", status=404).body(), 404)


async def _not_allowed(http, _):
    return JSONResponse(RequestError(f"{http.method} is not allowed on {http.url.path}", status=405).body(), 405)


async def _failed(_, error: Exception):
    return JSONResponse(_error_body(error), status_code=500)
