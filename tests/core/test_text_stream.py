from core.decode.text_stream import TextStream
from tests.tiny import make_tokenizer

TOK = make_tokenizer()


def feed(stream, text):
    out = ""
    for tid in TOK(text, add_special_tokens=False)["input_ids"]:
        out += stream.push(tid)
    return out + stream.flush()


def test_streamed_pieces_join_to_full_text():
    s = TextStream(TOK)
    assert feed(s, "The answer is 391.") == "The answer is 391."


def test_stop_string_cuts_and_is_not_emitted():
    s = TextStream(TOK, stop=("391",))
    out = feed(s, "The answer is 391. More text")
    assert out == "The answer is " and s.stopped and s.text == "The answer is "


def test_partial_stop_prefix_is_released_at_end():
    s = TextStream(TOK, stop=("39x",))
    assert feed(s, "is 39") == "is 39"


def test_the_earliest_stop_string_wins_whatever_the_order_given():
    """With stops ("b", "ab") the text "xab" ends before "ab", not before "b" (which would leave its "a" shown)."""
    for stop in (("b", "ab"), ("ab", "b")):
        s = TextStream(TOK, stop=stop)
        assert feed(s, "xab") == "x" and s.stopped and s.text == "x"


class BytesTokenizer:
    """Each id is a chunk of UTF-8 bytes, decoded as byte-level BPE is: an unfinished character becomes U+FFFD."""

    def __init__(self, *chunks: bytes):
        self.chunks = chunks

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.chunks[i] for i in ids).decode("utf-8", errors="replace")


def test_a_token_ending_inside_a_character_still_shows_and_stops_what_comes_before():
    """A token holding whole characters and the first byte of the next one: its text before that byte is final,
    and a stop string in it ends the stream (it used to wait, and show the stop's start at the end)."""
    tok = BytesTokenizer(b"The answer is 39", "1 \u65e5".encode()[:3], "\u65e5".encode()[1:], "ok \u65e5".encode()[:4])
    s = TextStream(tok, stop=("391",))
    assert s.push(0) == "The answer is " and s.push(1) == "" and s.stopped
    assert s.flush() == "" and s.text == "The answer is "
    plain = TextStream(tok)
    assert plain.push(3) == "ok " and plain.flush() == "" and plain.text == "ok "  # cut inside a character
    whole = TextStream(tok)
    assert whole.push(0) + whole.push(1) + whole.push(2) + whole.flush() == "The answer is 391 \u65e5"


def full_texts(tok, ids):
    return [tok.decode(ids[:i + 1], skip_special_tokens=True).rstrip("\ufffd") for i in range(len(ids))]


def test_incremental_text_equals_decoding_everything_at_every_token():
    """Decoding only the ids since the last clean cut gives, token by token, the text a whole decode gives: on
    the real tokenizer over mixed scripts and emoji (multi-token characters), and on byte chunks that split
    characters across two and three tokens."""
    text = "Résumé: 日本語のテキスト 👩‍🔬 and 391 × 2 = 782.\n\n```py\nprint('ok')\n```" * 3
    ids = TOK(text, add_special_tokens=False)["input_ids"]
    s = TextStream(TOK)
    assert [s.push(t) is not None and s.text for t in ids] == full_texts(TOK, ids)
    whole = "a\u65e5\U0001f469b".encode()
    tok = BytesTokenizer(*[whole[i:i + 1] for i in range(len(whole))])
    s = TextStream(tok)
    assert [s.push(t) is not None and s.text for t in range(len(whole))] == full_texts(tok, list(range(len(whole))))


class CleanupTokenizer:
    """A tokenizer whose text is not the sum of its pieces' texts: it joins " '" to "'" (as
    clean_up_tokenization_spaces does), so a piece's text depends on the piece before the one before."""

    chunks = ("x", " ", "'s", " fine", " .")

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.chunks[i] for i in ids).replace(" '", "'").replace(" .", ".")


def test_a_tokenizer_whose_text_is_not_additive_falls_back_to_decoding_everything():
    tok, ids = CleanupTokenizer(), [0, 1, 2, 3, 4]
    s = TextStream(tok)
    assert [s.push(t) is not None and s.text for t in ids] == full_texts(tok, ids)
