"""The model behind ``etmlx serve``: one loaded program and its KV cache, which one
worker thread gives to one request at a time, in the order they came (a program
exported for the LLM runner computes one sequence per call). A request is prepared
(templated, tokenized, its grammar compiled) as it arrives, so a bad one is refused at
once; its generation then streams ``Piece``s and one ``Finished`` (or a ``Failed``)
through the callback it was submitted with. A cancelled request (its client gone)
stops at its next token, or before it starts. The program is loaded on the worker
thread too: MLX's streams belong to the thread that made them."""

import copy
import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from etmlx.llm.chat import template_ids
from etmlx.llm.generation import GenerationError, Session, Stats, decode_after, stream_text
from etmlx.llm.speculative import check_pair, speculative_decode
from . import grammar, tool_calls
from .protocol import Request, RequestError
from .saved_prompts import SavedPrompts

FINISH_REASONS = {"eos": "stop", "stop string": "stop", "constraint": "stop", "max_new_tokens": "length",
                  "context": "length"}


@dataclass
class Piece:
    """Text to show, and the logprobs of the tokens it came with (``Request.logprobs``)."""

    text: str
    logprobs: list = field(default_factory=list)


@dataclass
class Finished:
    finish_reason: str
    usage: dict
    tool_calls: list = field(default_factory=list)


@dataclass
class Failed:
    error: Exception


@dataclass
class Job:
    request: Request
    ids: list
    constraint: object
    emit: object  # called from the worker thread with each Piece, then Finished or Failed
    cancelled: threading.Event = field(default_factory=threading.Event)
    pixel_values: object = None  # the request's images (or tiles), as ``PromptImages`` takes them
    image_token: int | None = None

    @property
    def reusable(self) -> int:
        """How much of ``ids`` a cache that held them may serve: up to the first image's
        placeholders, which look alike whatever image they stand for."""
        if self.pixel_values is None:
            return len(self.ids)
        from etmlx.multimodal.images import first_placeholder

        return first_placeholder(self.ids, self.image_token)


class Engine:
    """``load()`` returns the program (``etmlx.load``'s); it is called on the worker, as
    ``draft_of(session)`` is, which returns the draft's ``Session`` for speculative
    decoding (``etmlx.llm.speculative``) of requests that need no grammar and no logprobs:
    another program's, or one over the target's own (``etmlx.llm.draft``). ``folder``: where
    a vision-language program's processor lies, for chat messages with image parts."""

    def __init__(self, load, tokenizer, name: str, max_tokens: int = 512, saved_bytes: int = 512 << 20,
                 temperature: float = 0.0, draft_of=None, num_draft_tokens: int = 4, folder=None):
        self.tokenizer, self.name, self.max_tokens, self.temperature = tokenizer, name, max_tokens, temperature
        self.saved_bytes, self.num_draft_tokens = saved_bytes, num_draft_tokens
        self.draft, self.draft_held = None, []
        self.worker_tokenizer = copy.deepcopy(tokenizer)  # a tokenizer is not shared between threads
        self.held = []  # the ids the live cache holds, from position 0
        self.grammar_tokens = None
        self.counts = {"requests": 0, "generated_tokens": 0}  # what /health reports
        self.jobs, loaded = queue.Queue(), queue.Queue()
        threading.Thread(target=self._work, args=(load, draft_of, folder, loaded), name="etmlx-serve-engine",
                         daemon=True).start()
        failure = loaded.get()
        if failure is not None:
            raise failure
        self.vocab = int(self.session.limits.get("get_vocab_size", len(tokenizer)))

    @property
    def context(self) -> int:
        return self.session.context

    def prepare(self, request: Request, emit) -> Job:
        """The request's job; a RequestError where it cannot be served."""
        if request.images:
            return self._image_job(request, emit)
        if request.chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise RequestError("this model's tokenizer has no chat template: use /v1/completions", "messages")
            try:
                ids = template_ids(self.tokenizer, request.messages, request.tools)
            except Exception as error:  # noqa: BLE001 (a template raises what it likes; the messages are the cause)
                raise RequestError(f"the chat template refused these messages: {error}", "messages") from None
        elif isinstance(request.prompt, str):
            ids = self.tokenizer.encode(request.prompt)
        else:
            ids = list(request.prompt)
            if max(ids) >= self.vocab:
                raise RequestError(f"prompt: token id {max(ids)} is past the vocabulary of {self.vocab}", "prompt")
        self._check_length(ids, "messages" if request.chat else "prompt")
        return Job(request, ids, self._constraint(request), emit)

    def _image_job(self, request: Request, emit) -> Job:
        """A chat request with images: the processor's prompt (its template, each image's
        placeholders) and pixel values."""
        from etmlx.multimodal.images import NEEDS_IMAGE_METHODS, conversation_prompt

        if self.processor is None:
            raise RequestError(f"this model {NEEDS_IMAGE_METHODS}", "messages")
        if request.tools:
            raise RequestError("tools with image parts: this server templates tools for text conversations only",
                               "tools")
        try:
            ids, pixel_values = conversation_prompt(self.processor, request.messages, request.images)
        except GenerationError as error:
            raise RequestError(str(error), "messages") from None
        except Exception as error:  # noqa: BLE001 (a processor raises what it likes; the messages are the cause)
            raise RequestError(f"the processor refused these messages: {error}", "messages") from None
        self._check_length(ids, "messages")
        return Job(request, ids, self._constraint(request), emit, pixel_values=pixel_values,
                   image_token=self.image_token)

    def _check_length(self, ids: list, param: str) -> None:
        if not ids:
            raise RequestError("the prompt holds no tokens", "prompt")
        if len(ids) >= self.context:
            raise RequestError(f"the prompt holds {len(ids)} tokens; this model's context is {self.context} "
                               "(export with a larger --max-context)", param, "context_length_exceeded")

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def _constraint(self, request: Request):
        if not (request.forced_tools or request.response_format):
            return None
        if self.grammar_tokens is None:
            self.grammar_tokens = grammar.Tokens(self.tokenizer, self.vocab, self.session.eos_ids)
        try:
            if request.forced_tools:
                return grammar.Constraint(self.grammar_tokens, grammar.tool_call_grammar(request.forced_tools))
            return grammar.Constraint(self.grammar_tokens, grammar.json_grammar(request.response_format["schema"]))
        except grammar.GrammarError as error:
            raise RequestError(str(error), "tool_choice" if request.forced_tools else "response_format") from None

    def _work(self, load, draft_of, folder, loaded: queue.Queue) -> None:
        from etmlx.multimodal.images import processor_for

        try:
            self.session = Session(load())
            self.saved = SavedPrompts(self.session, self.saved_bytes)
            self.processor = processor_for(self.session.program, folder) if folder else None
            self.image_token = None if self.processor is None else int(
                self.session.program.run_method("image_token_id", [])[0])
            if draft_of is not None:
                self.draft = draft_of(self.session)
                check_pair(self.session, self.draft, self.num_draft_tokens)
                self.counts.update(draft_proposed=0, draft_accepted=0)
        except Exception as error:  # noqa: BLE001 (raised again by __init__, on the caller's thread)
            loaded.put(error)
            return
        loaded.put(None)
        while True:
            job = self.jobs.get()
            if job.cancelled.is_set():
                continue
            self.counts["requests"] += 1
            try:
                job.emit(self._run(job))
            except GenerationError as error:  # the request's settings, met only while generating
                self._forget()
                job.emit(Failed(RequestError(str(error))))
            except Exception as error:  # noqa: BLE001 (the request fails, the server keeps serving)
                self._forget()
                job.emit(Failed(error))

    def _forget(self) -> None:
        """After a failed generation, nothing the cache holds is trusted."""
        self.held = self.draft_held = []
        self.session.position = 0

    def _run(self, job: Job) -> Finished:
        from etmlx.multimodal.images import PromptImages

        request, ids = job.request, job.ids
        self._reuse(ids[:job.reusable])
        self.held = self.held[:job.reusable]
        images = job.pixel_values is not None
        self.session.images = PromptImages(self.session.program, job.pixel_values, ids) if images else None
        stats, generated = Stats(), []
        max_tokens = min(request.max_tokens or self.max_tokens, self.context - len(ids))
        held = tool_calls.Held() if request.parses_tool_calls else None
        drafting = self.draft is not None and job.constraint is None and not request.logprobs and not images
        if drafting:
            steps = speculative_decode(self.session, self.draft, ids, max_tokens, request.sampling,
                                       self.num_draft_tokens, stats, held=(self.held, self.draft_held))
        else:
            steps = decode_after(self.session, self.held, ids, max_tokens, request.sampling, stats,
                                 constraint=job.constraint, logits=request.logprobs)
        self.held = []  # until the generation ends, the cache holds what it is writing

        def tokens():
            for step in steps:
                if job.cancelled.is_set():
                    return
                generated.append(step)
                self.counts["generated_tokens"] += 1
                yield step.token

        reported = 0
        for text in stream_text(self.worker_tokenizer, tokens(), request.stop, stats, self.session.eos_ids):
            entries = [self._logprob(step, request.top_logprobs) for step in generated[reported:]
                       if request.logprobs and step.token not in self.session.eos_ids]
            reported = len(generated)
            text = held.add(text) if held else text
            if text or entries:
                job.emit(Piece(text, entries))
        self.held = (ids + [step.token for step in generated])[: self.session.position]
        if images:  # placeholders look alike whatever image they stand for: never served again
            self.held = self.held[:job.reusable]
        if drafting:
            self.draft_held = (ids + [step.token for step in generated])[: self.draft.position]
            self.counts["draft_proposed"] += stats.draft_proposed
            self.counts["draft_accepted"] += stats.draft_accepted
        rest, calls = held.finish() if held else ("", [])
        if not request.parallel_tool_calls:
            calls = calls[:1]
        if rest:
            job.emit(Piece(rest))
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                 "total_tokens": len(ids) + len(generated),
                 "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}
        return Finished("tool_calls" if calls else FINISH_REASONS[stats.stop_reason], usage, calls)

    def _reuse(self, ids: list) -> None:
        """Makes the cache hold as much of ``ids`` as is kept anywhere: the live cache,
        or a saved one written back (the live one saved first, if it is to be lost)."""
        live = self.saved.reusable(self.held, ids)
        saved, count = self.saved.best(ids)
        if live < len(self.held) or count > live:
            self.saved.keep(self.held)
        if count > live:
            self.held = self.saved.restore(saved)
            if self.draft is not None and self.draft.program is self.session.program:
                self.draft_held = []  # the draft's caches in the same program were written back too

    def _logprob(self, step, top: int) -> dict:
        logits = np.asarray(step.logits, dtype=np.float64)
        shifted = logits - logits.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        entry = self._token_entry(step.token, logprobs[step.token])
        best = np.argsort(-logprobs, kind="stable")[:top]
        entry["top_logprobs"] = [self._token_entry(int(t), logprobs[t]) for t in best]
        return entry

    def _token_entry(self, token: int, logprob: float) -> dict:
        text = self.worker_tokenizer.decode([token])
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode())}
