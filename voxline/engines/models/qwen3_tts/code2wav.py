"""The 12 Hz codec's decoder (codes -> 24 kHz waveform), stateful and streaming.

Every part of the decoder is causal: convolutions pad only on the left, transposed
convolutions trim only on the right, and the transformer attends to a sliding window of
past frames. :class:`Code2WavDecoder` therefore decodes each frame exactly once and
carries, per stream, only what later frames need (:class:`Code2WavState`): the last
``(kernel - 1) * dilation`` input columns of each convolution, the previous input frame
of each overlapping transposed convolution, and the transformer's keys/values within
its window. Decoding a stream in chunks of any size equals one full-sequence decode
(the full decode *is* a single chunk from a fresh state, whose zero tails are the
reference's zero padding).

Module and parameter names mirror the reference's ``decoder.*`` keys in
``speech_tokenizer/model.safetensors``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxline.engines.models.layers import MLP, RMSNorm
from voxline.kernels.attention import position_mask
from voxline.kernels.snake import snake_beta_log

from .config import Code2WavConfig, RopeConfig
from .layers import Attention, KVHook, Rope

__all__ = ["Code2WavDecoder", "Code2WavState"]


# --------------------------------------------------------------------------- state


@dataclass
class Code2WavState:
    """Streaming state of ``B`` streams (one per row); see the module docstring.

    ``keys``/``values`` hold ``window - 1`` slots per layer; ``key_pos`` gives each
    slot's absolute frame position, ``-1`` for a slot not yet filled. ``frames`` counts
    the frames each row has decoded (the next frame's RoPE position).
    """

    tails: list[Tensor]
    keys: list[Tensor]
    values: list[Tensor]
    key_pos: Tensor
    frames: Tensor

    @property
    def batch(self) -> int:
        return int(self.frames.shape[0])

    @classmethod
    def cat(cls, states: Sequence[Code2WavState]) -> Code2WavState:
        """Stack streams' states along the batch (for one batched decode)."""
        if len(states) == 1:
            return states[0]
        return cls(
            tails=[torch.cat(ts) for ts in zip(*(s.tails for s in states), strict=True)],
            keys=[torch.cat(ks) for ks in zip(*(s.keys for s in states), strict=True)],
            values=[torch.cat(vs) for vs in zip(*(s.values for s in states), strict=True)],
            key_pos=torch.cat([s.key_pos for s in states]),
            frames=torch.cat([s.frames for s in states]),
        )

    def rows(self, start: int, stop: int) -> Code2WavState:
        return Code2WavState(
            tails=[t[start:stop] for t in self.tails],
            keys=[k[start:stop] for k in self.keys],
            values=[v[start:stop] for v in self.values],
            key_pos=self.key_pos[start:stop],
            frames=self.frames[start:stop],
        )

    def assign(self, other: Code2WavState) -> None:
        self.tails, self.keys, self.values = other.tails, other.keys, other.values
        self.key_pos, self.frames = other.key_pos, other.frames


class _Context:
    """Tails read and replaced by the streaming modules during one decode call."""

    def __init__(self, tails: list[Tensor]) -> None:
        self.tails = list(tails)


# --------------------------------------------------------------------------- convs


class _Streaming(nn.Module):
    """A module with a per-stream input tail; ``state_index`` is set by the decoder."""

    state_index: int = -1
    tail_channels: int = 0
    tail_len: int = 0

    def _with_tail(self, x: Tensor, ctx: _Context) -> Tensor:
        tail = ctx.tails[self.state_index]
        z = torch.cat((tail, x), dim=-1)
        if self.tail_len:
            ctx.tails[self.state_index] = z[..., z.shape[-1] - self.tail_len :]
        return z


class CausalConv(_Streaming):
    """Stride-1 conv with left context ``(k - 1) * dilation`` (zeros at stream start)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.tail_channels = c_in
        self.tail_len = (kernel - 1) * dilation

    def forward(self, x: Tensor, ctx: _Context) -> Tensor:
        return self.conv(self._with_tail(x, ctx))


class CausalTransConv(_Streaming):
    """Transposed conv whose output for input frame ``j`` is final once ``j`` arrives.

    Output block ``j`` (``stride`` samples) sums taps of inputs ``j, j-1, ...``; the
    previous ``ceil(kernel / stride) - 1`` input frames are kept as the tail and the
    incomplete right part is dropped (the reference trims ``kernel - stride`` samples).
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride = stride
        self.tail_channels = c_in
        self.tail_len = math.ceil(kernel / stride) - 1

    def forward(self, x: Tensor, ctx: _Context) -> Tensor:
        y = self.conv(self._with_tail(x, ctx))
        start = self.tail_len * self.stride
        return y[..., start : start + x.shape[-1] * self.stride]


class SnakeBeta(nn.Module):
    """``x + sin(e^alpha x)^2 / e^beta`` per channel (log-scale parameters)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return snake_beta_log(x, self.alpha, self.beta)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, ctx: _Context) -> Tensor:
        h = self.dwconv(x, ctx).permute(0, 2, 1)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).permute(0, 2, 1)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: Tensor, ctx: _Context) -> Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), ctx)), ctx)


class DecoderBlock(nn.Module):
    """SnakeBeta, x``rate`` transposed conv, three dilated residual units."""

    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * rate, rate)]
            + [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        )

    def forward(self, x: Tensor, ctx: _Context) -> Tensor:
        x = self.block[1](self.block[0](x), ctx)
        for unit in self.block[2:]:
            x = unit(x, ctx)
        return x


# --------------------------------------------------------------------------- quantizer


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: Tensor) -> Tensor:
        table = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        return F.embedding(codes, table)


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class _ResidualVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, out_dim: int) -> None:
        super().__init__()
        self.vq = _VQStack(n, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def decode(self, codes: Tensor) -> Tensor:
        """``codes [B, n, T]`` -> ``[B, out_dim, T]`` (layers summed in order)."""
        total: Tensor | float = 0.0
        for i, layer in enumerate(self.vq.layers):
            total = total + layer._codebook.decode(codes[:, i]).transpose(1, 2)
        return self.output_proj(total)


class SplitResidualQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) with separate projections."""

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        dim = config.codebook_dim // 2
        size = config.codebook_size
        self.rvq_first = _ResidualVQ(1, size, dim, config.codebook_dim)
        self.rvq_rest = _ResidualVQ(config.num_quantizers - 1, size, dim, config.codebook_dim)

    def decode(self, codes: Tensor) -> Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


# --------------------------------------------------------------------------- transformer


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class _TransformerLayer(nn.Module):
    def __init__(self, config: Code2WavConfig, idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, idx, qk_norm=False)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = _LayerScale(config.hidden_size)
        self.mlp_layer_scale = _LayerScale(config.hidden_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, kv: KVHook) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, kv))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class SlidingWindowTransformer(nn.Module):
    """The pre-vocoder transformer: each frame attends to itself and ``window - 1`` before."""

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        self.window = config.sliding_window
        self.layers = nn.ModuleList(_TransformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.rope = Rope(RopeConfig(theta=config.rope_theta, head_dim=config.head_dim))

    def forward(
        self, x: Tensor, state: Code2WavState
    ) -> tuple[Tensor, list[Tensor], list[Tensor], Tensor]:
        """``x [B, T, latent]`` -> ``y`` and the new keys, values and key positions."""
        b, t, _ = x.shape
        keep = self.window - 1
        pos = state.frames[:, None] + torch.arange(t, device=x.device)  # [B, T]
        k_pos = torch.cat((state.key_pos, pos), dim=1)
        mask = position_mask(pos, k_pos, window=self.window, k_valid=k_pos >= 0)
        h = self.input_proj(x)
        cos, sin = self.rope(pos, h.dtype)
        new_k: list[Tensor] = []
        new_v: list[Tensor] = []

        def kv(i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            k = torch.cat((state.keys[i], k), dim=2)
            v = torch.cat((state.values[i], v), dim=2)
            new_k.append(k[:, :, k.shape[2] - keep :])
            new_v.append(v[:, :, v.shape[2] - keep :])
            return k, v

        for layer in self.layers:
            h = layer(h, cos, sin, mask, kv)
        y = self.output_proj(self.norm(h))
        return y, new_k, new_v, k_pos[:, k_pos.shape[1] - keep :]


# --------------------------------------------------------------------------- decoder


class Code2WavDecoder(nn.Module):
    """Codes ``[B, Q, T]`` -> waveform ``[B, T * samples_per_frame]`` in [-1, 1].

    Streaming contract: ``state = dec.new_state()``, then ``dec.decode(state, chunk)``
    for consecutive chunks; the concatenated outputs equal ``dec.decode(dec.new_state(),
    all_codes)`` up to float rounding. ``decode_batch`` runs several streams' chunks as
    one batch.
    """

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.quantizer = SplitResidualQuantizer(config)
        self.pre_conv = CausalConv(config.codebook_dim, config.latent_dim, 3)
        self.pre_transformer = SlidingWindowTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(config.latent_dim, config.latent_dim, f, f), ConvNeXtBlock(config.latent_dim)])
            for f in config.upsampling_ratios
        )
        dims = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv(config.latent_dim, config.decoder_dim, 7)]
            + [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(config.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        )
        self._streaming = [m for m in self.modules() if isinstance(m, _Streaming)]
        for i, m in enumerate(self._streaming):
            m.state_index = i

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    def new_state(self, batch: int = 1) -> Code2WavState:
        """Fresh state for ``batch`` streams (start of an utterance)."""
        c = self.config
        dev, dt = self.device, self.dtype
        keep = c.sliding_window - 1
        kv_shape = (batch, c.num_key_value_heads, keep, c.head_dim)
        return Code2WavState(
            tails=[torch.zeros(batch, m.tail_channels, m.tail_len, device=dev, dtype=dt) for m in self._streaming],
            keys=[torch.zeros(kv_shape, device=dev, dtype=dt) for _ in range(c.num_hidden_layers)],
            values=[torch.zeros(kv_shape, device=dev, dtype=dt) for _ in range(c.num_hidden_layers)],
            key_pos=torch.full((batch, keep), -1, dtype=torch.long, device=dev),
            frames=torch.zeros(batch, dtype=torch.long, device=dev),
        )

    @torch.inference_mode()
    def decode(self, state: Code2WavState, codes: Tensor) -> Tensor:
        """Decode the next chunk ``codes [B, Q, T]`` (or ``[Q, T]`` for B=1); updates ``state``.

        Returns ``[B, T * samples_per_frame]`` (``[T * spf]`` for 2-D input).
        """
        squeeze = codes.dim() == 2
        if squeeze:
            codes = codes[None]
        b, q, t = codes.shape
        if q != self.config.num_quantizers:
            raise ValueError(f"expected {self.config.num_quantizers} codebooks, got {q}")
        if b != state.batch:
            raise ValueError(f"codes for {b} streams, state for {state.batch}")
        if t == 0:
            wav = torch.zeros(b, 0, device=self.device, dtype=self.dtype)
        else:
            wav = self.decode_chunk(state, codes.to(self.device))
        return wav[0] if squeeze else wav

    def decode_chunk(self, state: Code2WavState, codes: Tensor) -> Tensor:
        """:meth:`decode` of ``codes [B, Q, T]`` (T >= 1, on the device, shapes checked)
        -> ``[B, T * spf]``: plain tensor code (no mode switch) that ``torch.compile``
        traces whole."""
        t = codes.shape[-1]
        ctx = _Context(state.tails)
        h = self.quantizer.decode(codes)
        h = self.pre_conv(h, ctx).transpose(1, 2)
        h, keys, values, key_pos = self.pre_transformer(h, state)
        h = h.permute(0, 2, 1)
        for up, convnext in self.upsample:
            h = convnext(up(h, ctx), ctx)
        h = self.decoder[0](h, ctx)
        for block in self.decoder[1:-2]:
            h = block(h, ctx)
        h = self.decoder[-1](self.decoder[-2](h), ctx)
        state.assign(Code2WavState(ctx.tails, keys, values, key_pos, state.frames + t))
        return h.clamp(min=-1, max=1)[:, 0]

    def prime(self, state: Code2WavState, codes: Tensor) -> None:
        """Feed context frames whose audio is not wanted (e.g. a voice-clone reference)."""
        self.decode(state, codes)

    def decode_full(self, codes: Tensor) -> Tensor:
        """One-shot decode of whole sequences ``[B, Q, T]`` from a fresh state."""
        batch = 1 if codes.dim() == 2 else codes.shape[0]
        return self.decode(self.new_state(batch), codes)

    def decode_batch(self, states: Sequence[Code2WavState], chunks: Sequence[Tensor]) -> list[Tensor]:
        """Decode one chunk ``[Q, T_i]`` per single-stream state, batching equal ``T_i``."""
        if len(states) != len(chunks):
            raise ValueError("one chunk per state")
        out: list[Tensor | None] = [None] * len(states)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            if states[i].batch != 1:
                raise ValueError("decode_batch takes single-stream states")
            groups.setdefault(int(c.shape[-1]), []).append(i)
        for idx in groups.values():
            merged = Code2WavState.cat([states[i] for i in idx])
            wav = self.decode(merged, torch.stack([chunks[i] for i in idx]))
            for row, i in enumerate(idx):
                out[i] = wav[row]
                if len(idx) > 1:
                    states[i].assign(merged.rows(row, row + 1))
        return out  # type: ignore[return-value]
