"""The shared layer arithmetic (voxline.kernels.layer_ops) and its one home in both model families."""

from __future__ import annotations

import math

import torch

from voxline.engines.models import layers
from voxline.engines.models.llama import model as llama_model
from voxline.engines.models.qwen3_tts import code2wav, talker
from voxline.engines.models.qwen3_tts import layers as qwen_layers
from voxline.kernels.layer_ops import (
    apply_rope,
    rms_norm,
    rope_tables,
    rotate_half,
    top_k_top_p_drop,
)


def test_both_families_build_from_the_same_layers():
    for module in (llama_model, qwen_layers, talker, code2wav):
        assert getattr(module, "RMSNorm", layers.RMSNorm) is layers.RMSNorm
    assert llama_model.MLP is qwen_layers.MLP is layers.MLP


def test_top_k_top_p_drop_keeps_the_best_ranks():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4)
    scores = probs.log()
    top_k = torch.tensor([0, 1, 3, 0])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.7])
    keep = ~top_k_top_p_drop(scores, top_k, top_p)
    assert keep.tolist() == [
        [True, True, True, True],  # neither filter
        [True, False, False, False],  # top-k 1
        [True, True, True, False],  # top-k 3
        [True, True, False, False],  # 0.5 < 0.7 <= 0.8: the smallest prefix with mass >= p
    ]
    # The best rank always stays, whatever p.
    assert (~top_k_top_p_drop(scores[:1], torch.tensor([0]), torch.tensor([0.0])))[0, 0]


def test_rms_norm_and_rope_are_the_plain_formulas():
    x = torch.randn(2, 3, 8)
    w = torch.randn(8)
    expected = w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.allclose(rms_norm(x, w, 1e-6), expected, atol=1e-6)
    assert torch.equal(layers.RMSNorm(8, 1e-6).forward(x), rms_norm(x, torch.ones(8), 1e-6))

    positions = torch.arange(3)[None]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    cos, sin = rope_tables(positions, inv_freq, torch.float32)
    assert cos.shape == (1, 1, 3, 8)
    q = torch.randn(1, 2, 3, 8)
    rotated = apply_rope(q, cos, sin)
    # A rotation keeps each pair's norm; position 0 is the identity.
    pairs = lambda t: torch.stack(t.chunk(2, dim=-1), -1).norm(dim=-1)  # noqa: E731
    assert torch.allclose(pairs(rotated), pairs(q), atol=1e-5)
    assert torch.equal(rotated[:, :, 0], q[:, :, 0])
    assert torch.equal(rotate_half(rotate_half(q)), -q)
    scaled_cos, _ = rope_tables(positions, inv_freq, torch.float32, scale=math.e)
    assert torch.allclose(scaled_cos, cos * math.e)
