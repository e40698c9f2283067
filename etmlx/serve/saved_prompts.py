"""Prompt caches kept across requests: before a request writes over what the KV cache
holds, the cache (its filled part: ``read_state``) is kept in memory with the ids it
holds; a later request that begins with more of one of them than of the live cache
has it written back and prefills only what follows. The least recently used go first
once their bytes pass the budget."""

from collections import OrderedDict

from etmlx.llm.causal_lm import RECURRENT_STATE_METHOD
from etmlx.llm.generation import Session, common_prefix


class SavedPrompts:
    def __init__(self, session: Session, max_bytes: int):
        self.session, self.max_bytes = session, max_bytes
        self.entries = OrderedDict()  # tuple of ids -> the state's arrays
        self.bytes = 0

    def reusable(self, held: list, ids: list) -> int:
        """How many of ``ids`` a cache holding ``held`` can skip: their common prefix,
        less the last id (fed for its logits); where layers keep a recurrent state, only
        all of ``held`` or nothing (that state cannot go back)."""
        common = common_prefix(held, ids[:-1])
        if self.session.limits.get(RECURRENT_STATE_METHOD) and common < len(held):
            return 0
        return common

    def best(self, ids: list) -> tuple:
        """(the saved ids that hold most of ``ids``, how many) or (None, 0)."""
        best, most = None, 0
        for held in self.entries:
            count = self.reusable(list(held), ids)
            if count > most:
                best, most = held, count
        return best, most

    def keep(self, held: list) -> None:
        """Keeps the live cache, which holds ``held``, if the budget allows it."""
        key = tuple(held)
        if not key or key in self.entries:
            return
        arrays = self.session.program.read_state()
        size = sum(array.nbytes for _, array in arrays.values())
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= sum(array.nbytes for _, array in dropped.values())
        self.entries[key], self.bytes = arrays, self.bytes + size

    def restore(self, held: tuple) -> list:
        """Writes the saved cache back; the ids it holds."""
        self.entries.move_to_end(held)
        self.session.program.write_state(self.entries[held])
        self.session.position = len(held)
        return list(held)
