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
