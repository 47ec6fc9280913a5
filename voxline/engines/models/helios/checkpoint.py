"""Loading a diffusers-layout Helios checkpoint (what `HeliosPipeline.from_pretrained` or
`HeliosPyramidPipeline.from_pretrained` reads), and the driver that runs it.

Which pipeline: `sampler` "auto" follows the checkpoint's `model_index.json` (`_class_name`
HeliosPyramidPipeline for Helios-Mid and Helios-Distilled, HeliosPipeline for Helios-Base);
"pyramid" or "standard" forces one (the `video` setting's `helios-pyramid:DIR` runs a
checkpoint through the pyramid sampler whatever its index names, as diffusers' own example
runs Helios-Base).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers import DiffusionPipeline, HeliosPipeline, HeliosPyramidPipeline

SAMPLERS = ("auto", "standard", "pyramid")
PIPELINE_CLASSES = {"HeliosPipeline": HeliosPipeline,
                    "HeliosPyramidPipeline": HeliosPyramidPipeline}


def pipeline_class(root: Path, sampler: str = "auto") -> type[DiffusionPipeline]:
    """The pipeline class `sampler` picks for the checkpoint at `root`."""
    if sampler not in SAMPLERS:
        raise ValueError(f"video: sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
    if sampler == "pyramid":
        return HeliosPyramidPipeline
    if sampler == "standard":
        return HeliosPipeline
    name = json.loads((root / "model_index.json").read_text()).get("_class_name")
    if name not in PIPELINE_CLASSES:
        raise ValueError(f"video: {root}/model_index.json names {name!r}, not one of "
                         f"{', '.join(PIPELINE_CLASSES)}")
    return PIPELINE_CLASSES[name]


def load_helios(path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None,
                sampler: str = "auto") -> HeliosPipeline | HeliosPyramidPipeline:
    """The pipeline at `path` on `device`; `dtype` None keeps the checkpoint's dtypes (on
    a GPU bf16 for the transformer and text encoder; the VAE is best kept float32)."""
    root = Path(path)
    if not (root / "model_index.json").is_file():
        raise FileNotFoundError(f"video: {root} is not a diffusers checkpoint "
                                "(no model_index.json)")
    kwargs = {"torch_dtype": dtype} if dtype is not None else {}
    pipe = pipeline_class(root, sampler).from_pretrained(str(root), **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def parse_video_setting(value: str) -> tuple[str, str]:
    """`video` setting -> (sampler, checkpoint dir): 'helios:DIR' (auto) or
    'helios-pyramid:DIR' (pyramid)."""
    kind, sep, rest = value.partition(":")
    samplers = {"helios": "auto", "helios-pyramid": "pyramid"}
    if not sep or not rest or kind not in samplers:
        raise ValueError(f"video: {value!r} is not helios:DIR or helios-pyramid:DIR")
    return samplers[kind], rest


def set_attention_backend(transformer: torch.nn.Module, name: str) -> None:
    """Run `transformer`'s attention through diffusers' backend `name` (`video_attention`);
    a ValueError naming the setting when diffusers does not know it or cannot run it here
    (its package missing, or the wrong device)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    known = [b.value for b in AttentionBackendName]
    if name not in known:
        raise ValueError(f"video_attention={name!r} is not a diffusers attention backend "
                         f"(one of: {', '.join(known)})")
    if name == "native":
        return  # diffusers' default: nothing to switch
    try:
        transformer.set_attention_backend(name)
    except Exception as exc:  # diffusers checks the backend's package and version here
        raise ValueError(f"video_attention={name!r} cannot run here: {exc}") from exc
