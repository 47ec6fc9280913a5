"""Whisper-family speech recognition through `transformers`, from a local checkpoint.

Any `WhisperForConditionalGeneration` checkpoint directory (large-v3-turbo on a GPU, a
tiny one in tests) with its processor files (feature extractor + tokenizer) and a
`generation_config.json` that names the language and task tokens, as the official ones do.

Contract (the ASR stage's batched model, `voxline.engines.asr_stage.BatchASRModel`):
- `transcribe_many(clips, options)`: one transcript per 16 kHz mono float32 clip, in
  order. Clips with the same options go through one greedy `generate` call (Hugging
  Face takes one prompt per call). Every clip is padded to Whisper's 30 s window by the
  feature extractor and rows never attend to each other, so a clip's transcript does not
  depend on the batch it ran in.
- `language` is forced as the decoder's language token (``<|fr|>`` after
  ``<|startoftranscript|>``); None lets a multilingual model detect it. An English-only
  checkpoint (no ``lang_to_id``) takes only "en" (it needs no token).
- `prompt` conditions decoding on previous text: ``<|startofprev|> prompt`` before the
  start token (`processor.get_prompt_ids`); Whisper reads at most half its context of it,
  so a longer prompt keeps its end.
- A clip over 30 s is cut into 30 s windows transcribed side by side and joined.
- No draft reuse (Moonshine's `transcribe` reuses the last take's tokens): HF's generate
  cannot verify a given draft; on a GPU the batched call is the saving instead.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from voxline.engines.models.asr_tokens import ScoredTranscript, TokenLogprob, joined, token_of
from voxline.errors import ModelUnavailableError
from voxline.kernels.cuda_graphs import StageStream

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # Whisper's fixed input window


@dataclass(frozen=True)
class TranscriptionOptions:
    """A stream's transcription settings (session.audio.input.transcription)."""

    language: str | None = None
    prompt: str | None = None


def checkpoint_languages(model_dir: str | Path) -> tuple[str, ...]:
    """The language codes a checkpoint forces (from `generation_config.json`'s
    ``lang_to_id``; ``("en",)`` for an English-only one). Reads one JSON file, no model."""
    path = Path(model_dir) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelUnavailableError("Whisper", str(path), f"cannot read it: {exc}") from exc
    langs = config.get("lang_to_id") or {}
    codes = tuple(tok.strip("<|>") for tok in langs)
    return codes if config.get("is_multilingual", bool(codes)) and codes else ("en",)


class BatchTranscriber:
    """The batched-ASR contract's common part: `transcribe` is a batch of one, and a batch
    has one options entry per clip; a model implements `_transcribe`, which gives each
    clip's tokens' log-probabilities when asked (`scored`)."""

    def transcribe(self, audio: np.ndarray) -> str:
        """Text of one clip with the default options (the stage's one-job path)."""
        return self.transcribe_many([audio], [TranscriptionOptions()])[0]

    def transcribe_many(self, clips: Sequence[np.ndarray],
                        options: Sequence[TranscriptionOptions]) -> list[str]:
        """One transcript per clip, in order."""
        return [t.text for t in self._checked(clips, options, scored=False)]

    def transcribe_many_scored(self, clips: Sequence[np.ndarray],
                               options: Sequence[TranscriptionOptions]
                               ) -> list[ScoredTranscript]:
        """`transcribe_many` with each transcript's tokens and their log-probabilities."""
        return self._checked(clips, options, scored=True)

    def _checked(self, clips: Sequence[np.ndarray], options: Sequence[TranscriptionOptions],
                 scored: bool) -> list[ScoredTranscript]:
        if len(clips) != len(options):
            raise ValueError(f"{len(clips)} clips but {len(options)} options")
        return self._transcribe(clips, options, scored)

    def _transcribe(self, clips: Sequence[np.ndarray], options: Sequence[TranscriptionOptions],
                    scored: bool) -> list[ScoredTranscript]:
        raise NotImplementedError


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable character -> byte table (the alphabet of Whisper's BPE tokens)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class _PickLogprobs(LogitsProcessor):
    """Records each greedy step's pick's log-probability over the scores the pick is made
    from (it runs after Whisper's own processors, and changes nothing)."""

    def __init__(self) -> None:
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores32 = scores.float()
        self.logprobs.append(scores32.amax(-1) - torch.logsumexp(scores32, -1))
        return scores


class WhisperASR(BatchTranscriber):
    """Batched greedy Whisper transcription on one torch device."""

    SAMPLE_RATE = SAMPLE_RATE
    MIN_SAMPLES = SAMPLE_RATE // 10  # 0.1 s: shorter clips are transcribed as ""
    TOKENS_PER_SECOND = 10.0  # decode budget per audio second (stops runaway repetition)
    EXTRA_TOKENS = 8

    def __init__(self, model: torch.nn.Module, processor: object, *, max_batch: int = 16,
                 model_dir: str = "") -> None:
        self.model = model
        self.processor = processor
        self.max_batch = max_batch  # the ASR stage batches at most this many jobs
        self.model_dir = model_dir
        gen = model.generation_config
        self.multilingual = bool(getattr(gen, "lang_to_id", None)) and bool(
            getattr(gen, "is_multilingual", True))
        self.languages = (tuple(tok.strip("<|>") for tok in gen.lang_to_id)
                          if self.multilingual else ("en",))  # as `checkpoint_languages`
        self.context = int(model.config.max_target_positions)
        # its own stream on a GPU, urgent: a pause transcript starts a reply's prompt
        self._stream = StageStream(next(model.parameters()).device, urgent=True)
        tok = getattr(processor, "tokenizer", None)
        self._special = (set(getattr(tok, "all_special_ids", ())) |
                         set(getattr(tok, "added_tokens_decoder", {})))
        self._bytes = byte_decoder()

    @classmethod
    def load(cls, model_dir: str, device: str = "cpu", *, max_batch: int = 16) -> WhisperASR:
        """Load a checkpoint directory (bfloat16 on CUDA, float32 on the CPU).

        Raises ModelUnavailableError when the directory lacks a model or processor."""
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        directory = Path(model_dir)
        for name in ("config.json", "generation_config.json"):
            if not (directory / name).is_file():
                raise ModelUnavailableError("Whisper", str(directory / name),
                                            "asr=whisper:DIR needs a save_pretrained checkpoint "
                                            "directory (model, generation config, processor)")
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        t0 = time.perf_counter()
        model = WhisperForConditionalGeneration.from_pretrained(directory, dtype=dtype)
        model = model.to(device).eval()
        processor = WhisperProcessor.from_pretrained(directory)
        log.info("Whisper %s loaded on %s (%s) in %.2f s", directory, device, dtype,
                 time.perf_counter() - t0)
        return cls(model, processor, max_batch=max_batch, model_dir=str(directory))

    # ------------------------------------------------------------------ transcription

    def _transcribe(self, clips: Sequence[np.ndarray], options: Sequence[TranscriptionOptions],
                    scored: bool) -> list[ScoredTranscript]:
        """See the module docstring."""
        windows: list[tuple[int, np.ndarray]] = []  # (clip index, <= 30 s of it)
        for i, clip in enumerate(clips):
            audio = self._check(clip)
            if len(audio) >= self.MIN_SAMPLES:
                windows += [(i, audio[s:s + WINDOW_SAMPLES])
                            for s in range(0, len(audio), WINDOW_SAMPLES)]
        parts: list[list[ScoredTranscript]] = [[] for _ in clips]
        groups: dict[TranscriptionOptions, list[tuple[int, np.ndarray]]] = {}
        for i, window in windows:
            groups.setdefault(options[i], []).append((i, window))
        for opts, group in groups.items():
            texts = self._stream.run(self._generate, [w for _, w in group], opts, scored)
            for (i, _), text in zip(group, texts, strict=True):
                parts[i].append(text)
        return [joined(p) for p in parts]

    def _check(self, audio: np.ndarray) -> np.ndarray:
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D mono samples, got shape {list(audio.shape)}")
        return audio

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        """``<|startofprev|>`` + the prompt's tokens, cut to Whisper's half context."""
        ids = self.processor.get_prompt_ids(prompt, return_tensors="pt")
        keep = self.context // 2 - 1
        if len(ids) > keep:  # the start-of-prev token, then the prompt's end
            ids = torch.cat([ids[:1], ids[len(ids) - keep + 1:]])
        return ids

    def generate_kwargs(self, windows: Sequence[np.ndarray],
                        opts: TranscriptionOptions) -> dict[str, object]:
        """What `generate` is called with for one group (tests read it)."""
        features = self.processor.feature_extractor(
            list(windows), sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        kwargs: dict[str, object] = {
            "input_features": features.to(self.model.device, self.model.dtype),
            "do_sample": False, "num_beams": 1}
        reserved = 4  # <|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>
        if opts.prompt:
            prompt = self.prompt_ids(opts.prompt).to(self.model.device)
            kwargs["prompt_ids"] = prompt
            reserved += len(prompt)
        if self.multilingual:
            kwargs["task"] = "transcribe"
            if opts.language is not None:
                kwargs["language"] = opts.language
        kwargs["max_new_tokens"] = max(self.budget(len(w), reserved) for w in windows)
        return kwargs

    def budget(self, num_samples: int, reserved: int = 4) -> int:
        """Most tokens one window decodes (stops runaway repetition); the decoder's
        context less its `reserved` start tokens bounds it."""
        tokens = math.ceil(num_samples / SAMPLE_RATE * self.TOKENS_PER_SECOND) + self.EXTRA_TOKENS
        return max(1, min(tokens, self.context - reserved))

    @torch.inference_mode()
    def _generate(self, windows: Sequence[np.ndarray], opts: TranscriptionOptions,
                  scored: bool = False) -> list[ScoredTranscript]:
        if opts.language is not None and opts.language not in self.languages:
            raise ValueError(f"transcription language {opts.language!r}: this Whisper "
                             f"checkpoint knows {', '.join(self.languages)}")
        kwargs = self.generate_kwargs(windows, opts)
        record = _PickLogprobs() if scored else None
        if record is not None:
            kwargs["logits_processor"] = LogitsProcessorList([record])
        sequences = self.model.generate(**kwargs)  # the generated tokens only
        # each row cut to its own budget, so a clip's text does not depend on its batch
        reserved = 4 + (len(kwargs["prompt_ids"]) if "prompt_ids" in kwargs else 0)
        rows = [row[:self.budget(len(w), reserved)]
                for row, w in zip(sequences.tolist(), windows, strict=True)]
        texts = [t.strip() for t in self.processor.batch_decode(rows, skip_special_tokens=True)]
        if record is None:
            return [ScoredTranscript(t) for t in texts]
        return [ScoredTranscript(text, self._scored_tokens(i, row, record))
                for i, (text, row) in enumerate(zip(texts, rows, strict=True))]

    def _scored_tokens(self, i: int, row: list[int], record: _PickLogprobs
                       ) -> tuple[TokenLogprob, ...]:
        """Row `i`'s text tokens with the log-probabilities recorded as they were picked
        (the steps are the row's last tokens: any forced ones before them were not picked).
        Greedy decoding picks a top score, so the recorded top's log-probability is the
        token's even where two scores tie (bf16) and the record's index differs."""
        logprobs = torch.stack(record.logprobs, 1)[i].tolist() if record.logprobs else []
        first = len(row) - min(len(row), len(logprobs))
        tokenizer = self.processor.tokenizer
        out: list[TokenLogprob] = []
        for step, token in enumerate(row[first:]):
            if token in self._special:
                continue
            piece = tokenizer.convert_ids_to_tokens(token)
            raw = bytes(self._bytes[c] for c in piece if c in self._bytes)
            out.append(token_of(raw, logprobs[step]))
        return tuple(out)
