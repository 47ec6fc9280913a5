"""A ChatML tokenizer of any vocabulary size for random-weight Llama checkpoints (tests and
GPU benchmarks build real shapes with random weights; nothing is downloaded)."""

from __future__ import annotations

import random

LLM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SYLLABLES = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]


def chat_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    """Byte-level BPE with exactly `vocab_size` entries: specials, the 256 byte symbols
    (what text encodes to: no merges), then made-up words (what random picks decode to)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(LLM_SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    rng = random.Random(0)
    while len(vocab) < vocab_size:
        vocab.setdefault("Ġ" + "".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in LLM_SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast
