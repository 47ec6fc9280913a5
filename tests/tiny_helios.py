"""A tiny random Helios pipeline built locally (nothing fetched), for the video tests.

The component configs follow diffusers' own Helios fast test (2 transformer layers, a
3-channel-base Wan VAE), except the text side: a 2-layer UMT5 encoder built from its
config and a word-level tokenizer built from a fixed vocabulary here, so no hub id is
read. `save_tiny_helios(dir)` writes the diffusers layout that
`HeliosPipeline.from_pretrained(dir)` (and `voxline serve --video helios:DIR`) loads.

Sizes that keep a chunk fast on CPU: 16x16 frames (2x2 latents), 2 steps, sequence
length 16 (`TINY_MAX_SEQUENCE_LENGTH`), guidance 1.0 (one transformer call a step).
`build_tiny_helios_pyramid(variant)` is the same components under `HeliosPyramidPipeline`
(3 stages: 64x64 frames at the least).
"""

from __future__ import annotations

from pathlib import Path

TINY_MAX_SEQUENCE_LENGTH = 16
TINY_TEXT_DIM = 32
TINY_WORDS = ("dance monkey train crossing the mountains at sunset negative a cat dog "
              "over red blue").split()


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in TINY_WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=TINY_MAX_SEQUENCE_LENGTH)


def _tiny_text_encoder(vocab_size: int):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(vocab_size=vocab_size, d_model=TINY_TEXT_DIM, d_kv=8, d_ff=37,
                        num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return UMT5EncoderModel(config).eval()


def _tiny_components() -> dict:
    """Tokenizer, text encoder, VAE and transformer (no scheduler), seeded."""
    import torch
    from diffusers import AutoencoderKLWan, HeliosTransformer3DModel

    tokenizer = _tiny_tokenizer()
    torch.manual_seed(0)
    text_encoder = _tiny_text_encoder(len(tokenizer))
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    torch.manual_seed(0)
    transformer = HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=TINY_TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4),
        has_multi_term_memory_patch=True, guidance_cross_attn=True, zero_history_timestep=True,
        is_amplify_history=False)
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": vae,
            "transformer": transformer}


def build_tiny_helios():
    """A `HeliosPipeline` with tiny random weights (seeded, so every build is the same)."""
    from diffusers import HeliosPipeline, HeliosScheduler

    scheduler = HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True)
    pipe = HeliosPipeline(scheduler=scheduler, **_tiny_components())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_helios_pyramid(variant: str = "distilled"):
    """A `HeliosPyramidPipeline` with the same tiny components and a 3-stage scheduler:
    "distilled" (HeliosDMDScheduler, `is_distilled`, as Helios-Distilled), "mid" (HeliosScheduler
    with CFG-Zero*, as Helios-Mid) or "base" (HeliosScheduler, plain guidance). The smallest
    frame it makes is 64x64 (three stages halve the 8x8 latents twice)."""
    from diffusers import HeliosDMDScheduler, HeliosPyramidPipeline, HeliosScheduler

    # gamma 1/4, not the checkpoints' 1/3: at 1/3 the block-noise covariance is singular
    # (eigenvalue 1 - 3 gamma) and CPU LAPACK's Cholesky refuses it, a plain call too
    if variant == "distilled":
        scheduler = HeliosDMDScheduler(stages=3, gamma=0.25, use_dynamic_shifting=True,
                                       time_shift_type="linear")
    elif variant in ("mid", "base"):
        scheduler = HeliosScheduler(stages=3, gamma=0.25, use_dynamic_shifting=True)
    else:
        raise ValueError(f"tiny Helios pyramid variant {variant!r}")
    pipe = HeliosPyramidPipeline(scheduler=scheduler, is_distilled=variant == "distilled",
                                 is_cfg_zero_star=variant == "mid", **_tiny_components())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def save_tiny_helios(directory: Path, pyramid: str | None = None) -> Path:
    """Write the tiny pipeline (`pyramid` a variant name: the pyramid one) in the diffusers
    layout under `directory`; returns it."""
    pipe = build_tiny_helios() if pyramid is None else build_tiny_helios_pyramid(pyramid)
    pipe.save_pretrained(str(directory))
    return directory
