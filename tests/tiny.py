"""The tiny random Qwen2 the tests use: it lives in core.tiny (the self-test needs it in the frozen app)."""
from core.tiny import CHAT_TEMPLATE, CORPUS, SPECIAL, make_model, make_reasoning_engine, make_tokenizer, write_tiny_hf

__all__ = ["CHAT_TEMPLATE", "CORPUS", "SPECIAL", "make_model", "make_reasoning_engine", "make_tokenizer", "write_tiny_hf"]
