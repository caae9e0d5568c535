"""Token ids to streamed text: incremental detokenization and stop-string matching.

Holds back text that is an incomplete UTF-8 sequence or could still grow into a stop string, so what is
emitted never has to be taken back.
"""
from __future__ import annotations


class TextStream:
    """Feed token ids one at a time; get the new, final text to show."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.emitted = 0
        self.text = ""
        self.stopped = False

    def _decoded(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add a token; return the text that became final (may be empty)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        # an incomplete multi-byte character at the end decodes as U+FFFD: what comes before it is final
        self.text = text = self._decoded().rstrip("\ufffd")
        found = [at for s in self.stop if (at := text.find(s, max(0, self.emitted - len(s)))) != -1]
        if found:  # the earliest stop string, whichever of them is listed first
            at = min(found)
            self.stopped = True
            self.text = text[:at]
            return self._take(at)
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return self._take(len(text) - hold)

    def _take(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        piece = self.text[self.emitted:upto]
        self.emitted = upto
        return piece

    def flush(self) -> str:
        """At the end: release any held-back text (not a stop string after all)."""
        return "" if self.stopped else self._take(len(self.text))
