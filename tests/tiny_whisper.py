"""A tiny random-weight Whisper checkpoint built locally (nothing fetched), in the layout
`WhisperForConditionalGeneration` / `WhisperProcessor.from_pretrained` read, for the
`asr=whisper:DIR` path. Random weights: it transcribes garbage, tests assert behaviour."""

from __future__ import annotations

import json
from pathlib import Path

LANGUAGES = ("en", "fr", "de")
WORDS = ("hello", "there", "table", "four", "people", "please", "bonjour")


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (Whisper's BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def special_tokens() -> list[str]:
    return ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{lang}|>" for lang in LANGUAGES),
            "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
            "<|nospeech|>", "<|notimestamps|>"]


def build_tiny_whisper(directory: Path, seed: int = 0, config: dict | None = None) -> Path:
    """Write a tiny Whisper checkpoint (model, generation config, tokenizer, feature
    extractor) into `directory`; returns it. `config` overrides the model's shape (the GPU
    benchmark builds real shapes with it; bf16 on a GPU when one is there)."""
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    directory.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_chars()
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges: list[str] = []
    space = alphabet[ord(" ")]
    for word in WORDS:  # merge "Ġhello" letter by letter
        piece = space
        for ch in word:
            merges.append(f"{piece} {ch}")
            piece += ch
            vocab.setdefault(piece, len(vocab))
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = WhisperTokenizer(vocab=str(directory / "vocab.json"),
                                 merges=str(directory / "merges.txt"))
    tokenizer.add_special_tokens({"additional_special_tokens": special_tokens()})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in special_tokens()}
    shape = {**dict(num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                    decoder_ffn_dim=64, max_target_positions=64), **(config or {})}
    model_config = WhisperConfig(
        vocab_size=len(tokenizer), max_source_positions=1500, pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"], begin_suppress_tokens=None,
        suppress_tokens=None, **shape)
    torch.manual_seed(seed)
    if config and torch.cuda.is_available():
        with torch.device("cuda"):
            model = WhisperForConditionalGeneration(model_config).to(torch.bfloat16).eval()
    else:
        model = WhisperForConditionalGeneration(model_config).eval()
    generation = GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"], eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
        max_length=shape["max_target_positions"], is_multilingual=True,
        lang_to_id={f"<|{lang}|>": ids[f"<|{lang}|>"] for lang in LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"], prev_sot_token_id=ids["<|startofprev|>"],
        forced_decoder_ids=None, begin_suppress_tokens=None,
        # as real checkpoints do: no special token is generated as text (so it decodes to some)
        suppress_tokens=[i for t, i in ids.items() if t != "<|endoftext|>"])
    model.generation_config = generation
    model.save_pretrained(directory)
    features = WhisperFeatureExtractor(feature_size=shape["num_mel_bins"])
    WhisperProcessor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(directory)
    return directory
