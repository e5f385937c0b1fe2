"""Stop strings for a streamed reply: text is let out only once it cannot be the start of one."""

from __future__ import annotations


class StopMatcher:
    """feed(piece) returns the text that is safe to send and whether a stop string was reached.

    A tail that could still grow into a stop string is held back; `text` is everything let out,
    which ends just before the first stop string once one is found (the stop string itself
    is never sent, as in OpenAI's API).
    """

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.hit = False
        self.matched: str | None = None   # the stop string found, once one is
        self._held = ""

    def feed(self, piece: str) -> str:
        if self.hit:
            return ""
        pending = self._held + piece
        cut = _first_stop(pending, self.stops)
        if cut is not None:
            self.hit = True
            self.matched = min((s for s in self.stops if s in pending), key=pending.find)
            return self._let_out(pending[:cut], "")
        keep = _longest_stop_prefix_at_end(pending, self.stops)
        return self._let_out(pending[:len(pending) - keep], pending[len(pending) - keep:])

    def flush(self) -> str:
        """At the end of the reply: what was held back, since no stop string followed it."""
        if self.hit:
            return ""
        return self._let_out(self._held, "")

    def _let_out(self, text: str, held: str) -> str:
        self.text += text
        self._held = held
        return text


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _longest_stop_prefix_at_end(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest tail of `text` that some stop string starts with."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if stop.startswith(text[len(text) - size:]):
                best = size
                break
    return best
