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
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    active = _AttentionBackendRegistry._active_backend  # process-wide; diffusers sets it too
    try:
        transformer.set_attention_backend(name)
        _probe_attention(transformer, name)
    except Exception as exc:  # diffusers checks the backend's package and version here
        transformer.reset_attention_backend()  # the refused backend is not left in place
        _AttentionBackendRegistry.set_active_backend(active)
        raise ValueError(f"video_attention={name!r} cannot run here: {exc}") from exc


def _probe_attention(transformer: torch.nn.Module, name: str) -> None:
    """One tiny attention call through backend `name` on the transformer's device and
    dtype: a backend whose package loads but whose kernels cannot run on this device (cuDNN
    attention on a CPU) fails here at start-up, not at the first chunk."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    param = next(transformer.parameters())
    dtype = torch.bfloat16 if param.dtype == torch.float32 and param.is_cuda else param.dtype
    q = torch.randn(1, 16, 2, 64, device=param.device, dtype=dtype)
    with torch.no_grad():
        dispatch_attention_fn(q, q, q, backend=name)


VIDEO_WEIGHTS = ("bf16", "fp8")


def set_video_weights(transformer: torch.nn.Module, name: str) -> int:
    """Put `transformer`'s block projections in the number format `name` (`video_weights`):
    bf16 keeps them; fp8 makes each block linear a float8 one (lossy, a CUDA GPU of compute
    capability 8.9 or newer). A ValueError naming the setting when it cannot run; returns
    how many layers changed."""
    from voxline.kernels.float8_linear import float8_refusal, to_float8

    name = str(name)  # the setting's enum member or its value
    if name not in VIDEO_WEIGHTS:
        raise ValueError(f"video_weights={name!r} is not one of {', '.join(VIDEO_WEIGHTS)}")
    if name == "bf16":
        return 0
    refusal = float8_refusal(next(transformer.parameters()).device)
    if refusal is not None:
        raise ValueError(f"video_weights=fp8: {refusal}")
    return to_float8(transformer.blocks)
