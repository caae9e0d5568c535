"""A tiny random Qwen2 and a byte-level BPE tokenizer with Qwen's chat markup, built in code (no downloads).

Used by the tests and by `ponder --self-test` (which must run in the frozen app, where tests/ is not shipped).
"""
from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) ? !",
    "What is 17*23? The answer is 391. Let me think step by step about it.",
    "<think> reasoning </think> \\boxed{42} user assistant system hello world",
    "Ponder is an offline assistant. It answers questions about math and code.",
] * 20


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(vocab_size: int, seed: int = 0, hidden_size: int = 128):
    """hidden_size 256 gives linears torch's packed int4 kernel takes (models.quantization.packs_int4)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=2, bos_token_id=0, pad_token_id=0,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # larger-than-init weights so the random model has peaked, varied distributions
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.to(torch.bfloat16)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # fp32 frequencies, as from_pretrained
    return model


def write_tiny_hf(folder: Path) -> Path:
    """Save the tiny model + tokenizer as a safetensors HF folder."""
    tok = make_tokenizer()
    vocab = ((len(tok) + 63) // 64) * 64
    model = make_model(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def make_reasoning_engine(vocab_size: int = 448):
    """An Engine on the tiny model with a random (non-zero) reasoning adapter attached."""
    from core.adapters import lora as adapters
    from core.engine import Engine

    model = adapters.attach_new(make_model(vocab_size), rank=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.05)
    model.eval()
    return Engine(model, make_tokenizer(), model_id="tiny", context=512, adapter_name="reason")
