"""Talker prompts: the prefill embeddings and the per-frame text conditioning.

A talker input position is the *sum* of a text-side embedding (projected text token,
or one of the special ``tts_bos/eos/pad`` vectors) and a codec-side embedding (codec
control token, speaker vector, or a whole reference frame). The layout follows the
reference's ``Qwen3TTSForConditionalGeneration.generate`` (text side + codec side)::

    [instruct]                      projected ``<|im_start|>user\n{instruct}<|im_end|>\n``
    <|im_start|> assistant \n       projected text only
    pad+nothink pad+think_bos pad+think_eos            (language 'auto'), or
    pad+think pad+think_bos pad+lang pad+think_eos     (a language)
    [pad+speaker]                   preset voice, or x-vector of the Base model
    bos+codec_pad
    text[0]+codec_bos               (streaming text; non-streaming and ICL differ)

``input_ids`` are the tokenizer's ids of ``<|im_start|>assistant\\n{text}<|im_end|>\\n
<|im_start|>assistant\\n`` (build them with :func:`assistant_ids`). In streaming-text
mode (``non_streaming=False``) only the first text token is in the prompt and the rest
(then ``tts_eos``) is added to the talker input of frames 0, 1, ...; after it runs out
``tts_pad`` is added. ``non_streaming=True`` puts the whole text in the prompt.

Embedding calls are grouped as in the reference, so the prompt is bit-identical to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from voxline.kernels.cuda_graphs import to_device

from .config import Qwen3TTSConfig
from .talker import Talker

__all__ = [
    "ChatTokens",
    "QWEN_CHAT_TOKENS",
    "TalkerPrompt",
    "assistant_ids",
    "build_prompt",
    "instruct_ids",
    "ref_text_ids",
]


@dataclass(frozen=True)
class ChatTokens:
    """Chat-template token ids of the text tokenizer (Qwen2 BPE by default)."""

    im_start: int = 151644
    im_end: int = 151645
    assistant: int = 77091
    user: int = 872
    newline: int = 198


QWEN_CHAT_TOKENS = ChatTokens()


def assistant_ids(text_ids: Sequence[int], chat: ChatTokens = QWEN_CHAT_TOKENS) -> list[int]:
    """``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``."""
    head = [chat.im_start, chat.assistant, chat.newline]
    return [*head, *text_ids, chat.im_end, chat.newline, *head]


def ref_text_ids(text_ids: Sequence[int], chat: ChatTokens = QWEN_CHAT_TOKENS) -> list[int]:
    """Reference transcript for voice cloning: ``<|im_start|>assistant\\n{text}<|im_end|>\\n``."""
    return [chat.im_start, chat.assistant, chat.newline, *text_ids, chat.im_end, chat.newline]


def instruct_ids(text_ids: Sequence[int], chat: ChatTokens = QWEN_CHAT_TOKENS) -> list[int]:
    """Style instruction: ``<|im_start|>user\\n{instruct}<|im_end|>\\n``."""
    return [chat.im_start, chat.user, chat.newline, *text_ids, chat.im_end, chat.newline]


@dataclass
class TalkerPrompt:
    """What one stream feeds the talker.

    ``embeds [L, D]`` is prefilled; the input of frame ``k`` (the sum of its codebook
    embeddings) gets ``trailing_text[k]`` added while ``k < len(trailing_text)``, and
    ``pad_embed`` afterwards.

    Streaming text input: a prompt built with ``text_open=True`` keeps ``eos_embed``
    aside; :meth:`append_text` adds the projected ids of text written later and
    :meth:`end_text` closes it with ``tts_eos``. While it is open, frame ``k`` cannot be
    fed before ``trailing_text[k]`` exists (:meth:`has_text_for`); the caller holds the
    stream back until then, so the talker sees exactly the inputs of a prompt built with
    the whole text.
    """

    embeds: Tensor
    trailing_text: Tensor
    pad_embed: Tensor
    eos_embed: Tensor | None = None  # set while more text may be appended
    # trailing_text's rows as views, made when text arrives: a stream's step reads its
    # frame's row from this list, not by indexing the tensor (a torch call per stream and
    # step, each giving up the GIL the engine's other threads want)
    text_rows: list[Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.text_rows = list(self.trailing_text.unbind(0))

    @property
    def text_open(self) -> bool:
        return self.eos_embed is not None

    def has_text_for(self, k: int) -> bool:
        """Frame ``k``'s text-side input is known (it exists, or the text has ended)."""
        return k < len(self.text_rows) or not self.text_open

    def text_for_frame(self, k: int) -> Tensor:
        if k < len(self.text_rows):
            return self.text_rows[k]
        if self.text_open:
            raise RuntimeError(f"frame {k}'s text has not arrived (streaming text input)")
        return self.pad_embed

    def append_text(self, embeds: Tensor) -> None:
        """Add ``embeds [n, D]`` (:meth:`Talker.embed_text` of the new ids) to the text."""
        if not self.text_open:
            raise RuntimeError("the prompt's text has ended")
        new = embeds.to(self.trailing_text)
        self.trailing_text = torch.cat((self.trailing_text, new))
        self.text_rows.extend(new.unbind(0))

    def end_text(self) -> None:
        """No more text: ``tts_eos`` follows the last token, then ``tts_pad``."""
        if self.eos_embed is not None:
            self.trailing_text = torch.cat((self.trailing_text, self.eos_embed[None]))
            self.text_rows.append(self.eos_embed)
            self.eos_embed = None


def _language_id(config: Qwen3TTSConfig, language: str, speaker: str | None) -> int | None:
    talker = config.talker
    lang = language.lower()
    if lang == "auto":
        lang_id = None
    elif lang in talker.codec_language_id:
        lang_id = talker.codec_language_id[lang]
    else:
        raise ValueError(
            f"language {language!r} is not supported; choose 'auto' or one of "
            f"{sorted(talker.codec_language_id)}"
        )
    if lang in ("chinese", "auto") and speaker:
        dialect = talker.spk_is_dialect.get(speaker.lower(), False)
        if dialect:
            lang_id = talker.codec_language_id[str(dialect).lower()]
    return lang_id


@torch.inference_mode()
def build_prompt(
    talker: Talker,
    config: Qwen3TTSConfig,
    input_ids: Sequence[int] | Tensor,
    *,
    language: str = "auto",
    speaker: str | None = None,
    speaker_embedding: Tensor | None = None,
    instruct: Sequence[int] | Tensor | None = None,
    ref_ids: Sequence[int] | Tensor | None = None,
    ref_codes: Tensor | None = None,
    non_streaming: bool = False,
    text_open: bool = False,
) -> TalkerPrompt:
    """Build one stream's :class:`TalkerPrompt`.

    - CustomVoice: ``speaker`` names a preset voice (``config.talker.spk_id``); dialect
      voices switch ``language`` 'auto'/'chinese' to their dialect.
    - VoiceDesign / no voice: no ``speaker``; ``instruct`` (from :func:`instruct_ids`)
      describes the voice.
    - Base, x-vector: ``speaker_embedding [D]`` from the speaker encoder.
    - Base, in-context (ICL): additionally ``ref_ids`` (:func:`ref_text_ids`) and the
      reference audio's codes ``ref_codes [T, G]``; decode the output with those codes
      primed into the codec state (:meth:`Code2WavDecoder.prime`).

    ``text_open``: the text goes on (streaming text input; not with ``non_streaming``
    or in-context cloning, whose prompts hold the whole text): ``tts_eos`` is left out
    until :meth:`TalkerPrompt.end_text`.
    """
    c = config.talker
    dev = talker.device
    ids = (input_ids.to(dev, torch.long) if isinstance(input_ids, Tensor)
           else to_device(list(input_ids), torch.long, dev)).reshape(1, -1)
    if ids.shape[1] < 9:
        raise ValueError(
            f"input_ids has {ids.shape[1]} tokens; expected the assistant template around "
            "at least one text token (see assistant_ids)"
        )
    if speaker is not None and speaker_embedding is not None:
        raise ValueError("give either speaker (preset voice) or speaker_embedding, not both")
    if (ref_codes is None) != (ref_ids is None):
        raise ValueError("in-context voice cloning needs both ref_ids and ref_codes")
    if text_open and (non_streaming or ref_codes is not None):
        raise ValueError("text_open needs the streaming-text layout (no non_streaming, no "
                         "in-context reference)")

    def tok(values: list[int]) -> Tensor:
        return to_device([values], torch.long, dev)

    parts: list[Tensor] = []
    if instruct is not None and len(instruct) > 0:
        parts.append(talker.embed_text(torch.as_tensor(instruct, dtype=torch.long).reshape(1, -1)))

    speaker_embed = None
    if speaker:
        spk = speaker.lower()
        if spk not in c.spk_id:
            raise ValueError(f"speaker {speaker!r} is not supported; choose one of {sorted(c.spk_id)}")
        speaker_embed = talker.embed_codec(to_device(c.spk_id[spk], torch.long, dev))
    elif speaker_embedding is not None:
        speaker_embed = speaker_embedding.to(device=dev, dtype=talker.dtype)

    lang_id = _language_id(config, language, speaker)
    tts_bos, tts_eos, tts_pad = talker.embed_text(
        tok([config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id])
    ).chunk(3, dim=1)
    if lang_id is None:
        think = [c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id]
    else:
        think = [c.codec_think_id, c.codec_think_bos_id, lang_id, c.codec_think_eos_id]
    codec = [talker.embed_codec(tok(think))]
    if speaker_embed is not None:
        codec.append(speaker_embed.view(1, 1, -1))
    codec.append(talker.embed_codec(tok([c.codec_pad_id, c.codec_bos_id])))
    codec_in = torch.cat(codec, dim=1)  # [1, m, D]; its last entry is codec_bos

    role = talker.embed_text(ids[:, :3])
    text_side = torch.cat((tts_pad.expand(-1, codec_in.shape[1] - 2, -1), tts_bos), dim=1)
    parts += [role, text_side + codec_in[:, :-1]]

    text = ids[:, 3:-5]
    if ref_codes is not None:
        ref = torch.as_tensor(ref_ids, dtype=torch.long, device=dev).reshape(1, -1)[:, 3:-2]
        icl, trailing = _icl_inputs(
            talker, config, text, ref, ref_codes, tts_pad, tts_eos, non_streaming
        )
        parts.append(icl)
    elif non_streaming:
        body = torch.cat((talker.embed_text(text), tts_eos), dim=1)
        body = body + talker.embed_codec(tok([c.codec_pad_id] * (text.shape[1] + 1)))
        parts += [body, tts_pad + talker.embed_codec(tok([c.codec_bos_id]))]
        trailing = tts_pad
    else:
        parts.append(talker.embed_text(ids[:, 3:4]) + codec_in[:, -1:])
        trailing = torch.cat((talker.embed_text(ids[:, 4:-5]), tts_eos), dim=1)
        if text_open:
            trailing = trailing[:, :-1]
    return TalkerPrompt(
        embeds=torch.cat(parts, dim=1)[0],
        trailing_text=trailing[0],
        pad_embed=tts_pad[0, 0],
        eos_embed=tts_eos[0, 0] if text_open else None,
    )


def _icl_inputs(
    talker: Talker,
    config: Qwen3TTSConfig,
    text: Tensor,
    ref: Tensor,
    ref_codes: Tensor,
    tts_pad: Tensor,
    tts_eos: Tensor,
    non_streaming: bool,
) -> tuple[Tensor, Tensor]:
    """Reference transcript + target text aligned against the reference frames."""
    c = config.talker
    dev = talker.device
    text_embed = torch.cat((talker.embed_text(torch.cat((ref, text), dim=-1)), tts_eos), dim=1)
    codes = torch.as_tensor(ref_codes, dtype=torch.long).to(dev)
    if codes.dim() != 2 or codes.shape[1] != talker.num_code_groups:
        raise ValueError(f"ref_codes must be [frames, {talker.num_code_groups}], got {tuple(codes.shape)}")
    bos = talker.embed_codec(torch.tensor([[c.codec_bos_id]], device=dev))
    codec_embed = torch.cat((bos, talker.embed_frames(codes)[None]), dim=1)
    n_text, n_codec = text_embed.shape[1], codec_embed.shape[1]
    if non_streaming:
        pad_ids = torch.tensor([[c.codec_pad_id] * n_text], device=dev)
        icl = torch.cat((text_embed + talker.embed_codec(pad_ids), codec_embed + tts_pad), dim=1)
        return icl, tts_pad
    if n_text > n_codec:
        return text_embed[:, :n_codec] + codec_embed, text_embed[:, n_codec:]
    text_embed = torch.cat([text_embed] + [tts_pad] * (n_codec - n_text), dim=1)
    return text_embed + codec_embed, tts_pad
