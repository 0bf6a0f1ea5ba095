"""Token ids to streamed text: incremental detokenization and OpenAI stop strings.

A row accepts tokens in bursts (a Jacobi iteration may accept several), and a token's text is not always final when
it arrives: a multi-byte character split over two tokens decodes to U+FFFD until its last byte comes, and text that
may be the start of a stop string must not be sent before it is known not to be one. So the text sent is always a
prefix of the final text, grown by ``TextStream.push``:

* the whole response is decoded again on every push (tokenizers decode in Rust; responses are at most the
  context long), so merges and spacing are those of ``tokenizer.decode`` on the whole answer, i.e. the text a solo
  ``api.generate`` returns;
* trailing U+FFFD and any tail that is a proper prefix of a stop string are held back until the next push;
* a stop string ends the response before it (OpenAI's rule: the stop string itself is not returned), and the token
  list is cut after the token that completed it, so usage and ``token_ids`` do not depend on how many tokens the
  last iteration happened to accept.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the earliest stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` may still become a stop string (the longest tail that is a proper
    prefix of one), or are an incomplete character (U+FFFD at the end)."""
    keep = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), keep, -1):
            if stop.startswith(text[-size:]):
                keep = size
                break
    unfinished = len(text) - len(text.rstrip("\ufffd"))
    return max(keep, unfinished)


def tokens_through_stop(decode: Decode, tokens: Sequence[int], stops: Sequence[str]) -> int:
    """The fewest leading tokens whose text holds a stop string (``len(tokens)`` if none does)."""
    lo, hi = 0, len(tokens)  # invariant: tokens[:hi] holds a stop, tokens[:lo] does not (decode is monotone in it)
    if find_stop(decode(tokens), stops) < 0:
        return len(tokens)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if find_stop(decode(tokens[:mid]), stops) >= 0:
            hi = mid
        else:
            lo = mid
    return hi


@dataclasses.dataclass
class TextStream:
    """One response's tokens and the text sent so far (owned by the scheduler thread)."""

    decode: Decode
    stops: tuple[str, ...] = ()
    tokens: list[int] = dataclasses.field(default_factory=list)
    sent: int = 0
    """Characters of the text already handed out."""
    stopped: bool = False

    def push(self, ids: Sequence[int]) -> str:
        """Adds a burst of tokens; returns the text that became final. After a stop string, ``stopped`` is set and
        the tokens past the one that completed it are dropped."""
        self.tokens.extend(int(i) for i in ids)
        text = self.decode(self.tokens)
        cut = find_stop(text, self.stops) if self.stops else -1
        if cut >= 0:
            self.stopped = True
            self.tokens = self.tokens[: tokens_through_stop(self.decode, self.tokens, self.stops)]
            return self._advance(text[:cut])
        return self._advance(text[: len(text) - held_back(text, self.stops)])

    def finish(self) -> str:
        """The rest of the text once generation has ended (nothing is held back any more)."""
        if self.stopped:
            return ""
        text = self.decode(self.tokens)
        return self._advance(text)

    def _advance(self, text: str) -> str:
        delta = text[self.sent:]
        self.sent = max(self.sent, len(text))
        return delta
