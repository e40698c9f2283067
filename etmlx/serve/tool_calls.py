"""Tool calls in a model's text, in the Hermes / Qwen form their chat templates teach:
``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, any number of them, each
into an OpenAI ``tool_calls`` entry. A block whose JSON does not parse, or names no
function, stays in the text as the model wrote it."""

import json
import uuid

from etmlx.llm.generation import held_back

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse(text: str) -> tuple:
    """(the text outside the calls, stripped; the calls as OpenAI ``tool_calls``)."""
    content, calls, at = [], [], 0
    while (start := text.find(OPEN, at)) >= 0:
        end = text.find(CLOSE, start)
        if end < 0:
            break
        call = _call(text[start + len(OPEN):end])
        content.append(text[at:start] if call else text[at:end + len(CLOSE)])
        if call:
            calls.append(call)
        at = end + len(CLOSE)
    content.append(text[at:])
    return "".join(content).strip(), calls


def _call(body: str) -> dict | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(arguments)}}


class Held:
    """A stream's text with everything from a (possible) ``<tool_call>`` on held back
    until the end, where ``parse`` turns it into calls."""

    def __init__(self):
        self.text, self.shown = "", 0

    def add(self, piece: str) -> str:
        """What of the text so far can be shown now."""
        self.text += piece
        start = self.text.find(OPEN, self.shown)
        if start < 0:
            start = len(self.text) - held_back(self.text, (OPEN,))
        ready, self.shown = self.text[self.shown:max(start, self.shown)], max(start, self.shown)
        return ready

    def finish(self) -> tuple:
        """(the text not shown yet that is not a call, the calls)."""
        rest, calls = parse(self.text[self.shown:])
        return (rest if calls else self.text[self.shown:]), calls

