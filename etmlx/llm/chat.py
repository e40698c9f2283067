"""``etmlx chat``: a multi-turn conversation over one loaded program. Each turn is the
whole conversation in the tokenizer's chat template; only the tokens the KV cache does
not hold yet are fed, so a turn prefills its own message, not the conversation again.
A conversation and its cache can be saved to a file and continued from it in a fresh
load (``save``, ``restore``). With a vision-language program and its processor, a message
may carry an image (``reply(text, image)``): the conversation is then the processor's, each
image encoded once (``etmlx.multimodal.images``)."""

from . import prompt_cache
from .generation import GenerationError, Sampling, Session, Stats, decode_after, stream_text
from .speculative import check_pair, speculative_decode


class Chat:
    def __init__(self, session: Session, tokenizer, sampling: Sampling = Sampling(), max_new_tokens: int = 128,
                 system=None, draft: Session | None = None, num_draft_tokens: int = 4, processor=None):
        """``draft``: a smaller model of the same tokenizer that proposes
        ``num_draft_tokens`` at a time for ``session`` (exported with ``verify``) to check
        (``etmlx.llm.speculative``); its cache carries across turns too. ``processor``: a
        vision-language program's (transformers' ``AutoProcessor``), for messages with images."""
        if not getattr(tokenizer, "chat_template", None):
            raise GenerationError("this tokenizer has no chat template (tokenizer_config.json's chat_template): "
                                  "use etmlx generate")
        self.session, self.tokenizer, self.sampling, self.max_new_tokens = session, tokenizer, sampling, max_new_tokens
        self.draft, self.num_draft_tokens, self.processor = draft, num_draft_tokens, processor
        if draft is not None:
            check_pair(session, draft, num_draft_tokens)
        self.system = [{"role": "system", "content": system}] if system else []
        self.stats = Stats()
        self.reset()

    @property
    def fed_from(self) -> int:
        """Where the last turn's feeding began: the tokens before it were held."""
        return self.stats.cached_tokens

    def reset(self) -> None:
        """Starts over: the cache's contents are forgotten (and overwritten as it refills)."""
        self.messages = list(self.system)
        self.images, self.encoded = [], []  # the conversation's images, and their features once encoded
        self.cached = self.draft_cached = []  # the token ids each cache holds, from position 0
        self.session.position = 0

    def save(self, path) -> None:
        """Writes the conversation and the KV cache that holds it to ``path``
        (``etmlx.llm.prompt_cache``)."""
        if self.images:
            raise GenerationError("a conversation with images cannot be saved (its prompt cache holds text only)")
        prompt_cache.save(self.session.program, path, self.cached, {"messages": self.messages})

    def restore(self, path) -> None:
        """Continues the conversation ``save`` wrote, from the cache it saved: the next
        turn prefills only its own message."""
        tokens, extra = prompt_cache.restore(self.session.program, path)
        messages = extra.get("messages") if isinstance(extra, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise prompt_cache.PromptCacheError(f"{path} holds no conversation (saved by another tool than etmlx chat)")
        if len(tokens) > self.session.context:
            raise prompt_cache.PromptCacheError(f"{path} holds {len(tokens)} tokens, past the context of "
                                                f"{self.session.context}")
        self.messages, self.cached, self.draft_cached = messages, tokens, []  # the draft prefills again
        self.session.position = len(tokens)

    def reply(self, text: str, image=None):
        """Yields the assistant's reply to ``text`` (about ``image``, a PIL image, when
        given) as it is made, and keeps it in the conversation."""
        if image is not None and self.draft is not None:
            raise GenerationError("an image with --draft: speculative decoding takes text conversations only")
        if image is not None and self.processor is None:
            from etmlx.multimodal.images import NEEDS_IMAGE_METHODS

            raise GenerationError(f"this program {NEEDS_IMAGE_METHODS}")
        content = text if image is None else [{"type": "image"}, {"type": "text", "text": text}]
        self.messages.append({"role": "user", "content": content})
        self.images += [image] if image is not None else []
        ids = self._prompt_ids()
        if len(ids) >= self.session.context:
            self.messages.pop()
            self.images = self.images[:-1] if image is not None else self.images
            del self.encoded[len(self.images):]
            raise GenerationError(f"the conversation holds {len(ids)} tokens, past the context of "
                                  f"{self.session.context}: /reset to start over")
        self.stats, generated = Stats(), []

        if self.draft is None:
            steps = decode_after(self.session, self.cached, ids, self.max_new_tokens, self.sampling, self.stats)
        else:
            steps = speculative_decode(self.session, self.draft, ids, self.max_new_tokens, self.sampling,
                                       self.num_draft_tokens, self.stats, held=(self.cached, self.draft_cached))

        def tokens():
            for step in steps:
                generated.append(step.token)
                yield step.token

        pieces = []
        for piece in stream_text(self.tokenizer, tokens(), stats=self.stats, eos=self.session.eos_ids):
            pieces.append(piece)
            yield piece
        self.cached = (ids + generated)[: self.session.position]
        if self.draft is not None:
            self.draft_cached = (ids + generated)[: self.draft.position]
        self.messages.append({"role": "assistant", "content": "".join(pieces)})

    def _prompt_ids(self) -> list:
        """The conversation's ids; with images, the processor's, and the session told
        where their features go (``PromptImages``)."""
        if not self.images:
            self.session.images = None
            return template_ids(self.tokenizer, self.messages)
        from etmlx.multimodal.images import PromptImages, conversation_prompt

        ids, pixel_values = conversation_prompt(self.processor, self.messages, self.images)
        self.session.images = PromptImages(self.session.program, pixel_values, ids, self.encoded)
        return ids


def template_ids(tokenizer, messages: list, tools: list | None = None) -> list:
    """The token ids of ``messages`` in the tokenizer's chat template, up to the
    assistant's turn (the template writes the special tokens itself)."""
    templated = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(templated, add_special_tokens=False)
