"""Loading a diffusers-layout Helios checkpoint (what `HeliosPipeline.from_pretrained` reads)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import HeliosPipeline


def load_helios(path: str | Path, device: str = "cpu",
                dtype: torch.dtype | None = None) -> HeliosPipeline:
    """The pipeline at `path` on `device`; `dtype` None keeps the checkpoint's dtypes (on
    a GPU bf16 for the transformer and text encoder; the VAE is best kept float32)."""
    root = Path(path)
    if not (root / "model_index.json").is_file():
        raise FileNotFoundError(f"video: {root} is not a diffusers checkpoint "
                                "(no model_index.json)")
    kwargs = {"torch_dtype": dtype} if dtype is not None else {}
    pipe = HeliosPipeline.from_pretrained(str(root), **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
