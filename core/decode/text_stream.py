"""Token ids to streamed text: incremental detokenization and stop-string matching.

Holds back text that is an incomplete UTF-8 sequence or could still grow into a stop string, so what is
emitted never has to be taken back. Decodes incrementally, as vLLM and TGI do: each token decodes only the ids since
the cut before the last clean one (so a piece's text is read in the context of the piece before it), not the whole
stream again; where that window's text stops extending what came before, it decodes everything once more.
(Byte-level BPE, the registry's Qwen tokenizers, is additive, so that never happens there; a tokenizer whose text
depends on context older than the window would need a wider one.) Timed beside a sampling job on 2 cores: 8 us a
token at any length, against 65 us at 512 tokens and 286 us at 2,048 when each token decoded the whole stream,
each row.
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
        self._prefix = self._read = 0  # ids[:_read] decode cleanly to _clean; ids[_prefix:_read] is the context
        self._clean = ""

    def _decoded(self) -> str:
        """The text of all ids so far, an unfinished character at the end dropped."""
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix:self._read], skip_special_tokens=True)
        window = decode(self.ids[self._prefix:], skip_special_tokens=True)
        if not window.startswith(before):  # a tokenizer whose text is not additive here: decode it all
            self._prefix = self._read = 0
            self._clean = ""
            before, window = "", decode(self.ids, skip_special_tokens=True)
        if window.endswith("\ufffd"):
            return self._clean + window[len(before):].rstrip("\ufffd")
        self._clean += window[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        return self._clean

    def push(self, token_id: int) -> str:
        """Add a token; return the text that became final (may be empty)."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        # an incomplete multi-byte character at the end decodes as U+FFFD: what comes before it is final
        self.text = text = self._decoded()
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
