"""Qwen3-TTS talker and code predictor as plain PyTorch modules.

The talker is a Qwen3 decoder over *summed* embeddings (text projection + codec
embeddings) that predicts the first codebook of each 12.5 Hz frame; the code predictor
is a small Qwen3 decoder that, given the talker's last hidden state and that first code,
fills codebooks 2..N of the same frame one by one. Module and parameter names mirror the
reference (``talker.model.*``, ``talker.text_projection.*``, ``talker.codec_head``,
``talker.code_predictor.*``), so the checkpoint's ``talker.`` keys load unchanged.

The talker keeps one slot per stream in a static :class:`KVCache` (allocated once);
:meth:`Talker.forward_batch` runs any mix of prompt prefills and one-frame decode steps
over several slots at once. The code predictor needs no persistent state: each frame is
a fresh 2 + (N - 2) step run, batched across all streams in lockstep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxline.engines.models.kv_cache import KVCache
from voxline.engines.models.layers import RMSNorm
from voxline.kernels.attention import position_mask

from .config import CodePredictorConfig, TalkerConfig
from .layers import DecoderLayer, Rope

__all__ = ["CodePredictor", "Talker"]

# (logits [B, V] float32, codebook index 1..N-1) -> chosen codes [B] long.
CodePicker = Callable[[Tensor, int], Tensor]


class TextProjection(nn.Module):
    """Two-layer SiLU MLP from the text embedding width to the talker width."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


def _window_masks(
    windows: Sequence[int | None], q_pos: Tensor, k_pos: Tensor, k_valid: Tensor | None = None
) -> dict[int | None, Tensor]:
    return {w: position_mask(q_pos, k_pos, window=w, k_valid=k_valid) for w in set(windows)}


# --------------------------------------------------------------------------- code predictor


class _CodePredictorBackbone(nn.Module):
    def __init__(self, config: CodePredictorConfig, embedding_dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.vocab_size, embedding_dim) for _ in range(config.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Fills codebooks ``1..G-1`` of a frame from the talker state and codebook 0."""

    def __init__(self, config: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.config = config
        self.model = _CodePredictorBackbone(config, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            for _ in range(config.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, config.hidden_size, bias=True)
            if config.hidden_size != talker_hidden
            else nn.Identity()
        )
        self.rope = Rope(config.rope)
        self.windows = config.layer_windows

    @torch.inference_mode()
    def predict(self, talker_hidden: Tensor, first_embed: Tensor, pick: CodePicker, num_codes: int) -> Tensor:
        """``talker_hidden``, ``first_embed`` ``[B, D_talker]`` -> codes ``[B, num_codes]``.

        ``first_embed`` is the talker's embedding of codebook 0. Step ``i`` reads
        ``lm_head[i]`` and feeds back ``codec_embedding[i]`` of its pick, as the reference
        does; ``pick`` chooses each code (greedy or sampled, per row).
        """
        b = talker_hidden.shape[0]
        dev = talker_hidden.device
        keys: list[Tensor | None] = [None] * len(self.model.layers)
        values: list[Tensor | None] = [None] * len(self.model.layers)

        def kv(i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            if keys[i] is not None:
                k = torch.cat((keys[i], k), dim=2)
                v = torch.cat((values[i], v), dim=2)
            keys[i], values[i] = k, v
            return k, v

        x = self.small_to_mtp_projection(torch.stack((talker_hidden, first_embed), dim=1))
        start = 0
        codes = []
        for step in range(num_codes):
            q = x.shape[1]
            pos = torch.arange(start, start + q, device=dev).expand(b, q)
            cos, sin = self.rope(pos, x.dtype)
            k_pos = torch.arange(start + q, device=dev).expand(b, start + q)
            masks = _window_masks(self.windows, pos, k_pos)
            h = x
            for layer, window in zip(self.model.layers, self.windows, strict=True):
                h = layer(h, cos, sin, masks[window], kv)
            logits = self.lm_head[step](self.model.norm(h[:, -1])).float()
            code = pick(logits, step + 1)
            codes.append(code)
            start += q
            if step + 1 < num_codes:
                x = self.small_to_mtp_projection(self.model.codec_embedding[step](code)[:, None])
        return torch.stack(codes, dim=1)


# --------------------------------------------------------------------------- talker


class _TalkerBackbone(nn.Module):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class Talker(nn.Module):
    """Talker decoder + codec head + code predictor; see the module docstring."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        if config.code_predictor is None:
            raise ValueError("talker config has no code_predictor_config")
        if config.code_predictor.num_code_groups != config.num_code_groups:
            raise ValueError(
                f"code predictor has {config.code_predictor.num_code_groups} code groups, "
                f"talker {config.num_code_groups}"
            )
        self.config = config
        self.model = _TalkerBackbone(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.hidden_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor, config.hidden_size)
        self.rope = Rope(config.rope)
        self.windows = config.layer_windows
        self.cache: KVCache | None = None

    @property
    def device(self) -> torch.device:
        return self.codec_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.codec_head.weight.dtype

    @property
    def num_code_groups(self) -> int:
        return self.config.num_code_groups

    # -- embeddings ---------------------------------------------------------------------

    def embed_text(self, ids: Tensor) -> Tensor:
        """Text token ids ``[..., T]`` -> projected embeddings ``[..., T, D]``."""
        return self.text_projection(self.model.text_embedding(ids.to(self.device)))

    def embed_codec(self, ids: Tensor) -> Tensor:
        """Talker codec-vocabulary ids (codebook 0 and control tokens) -> ``[..., D]``."""
        return self.model.codec_embedding(ids.to(self.device))

    def embed_frames(self, codes: Tensor) -> Tensor:
        """Whole frames ``[B, G]`` -> the talker input for each ``[B, D]``.

        The sum over codebooks (codebook 0 through the talker's table, the others through
        the code predictor's) is taken in one reduction, as the reference does.
        """
        codes = codes.to(self.device)
        parts = [self.model.codec_embedding(codes[:, :1])]
        tables = self.code_predictor.model.codec_embedding
        parts += [tables[i](codes[:, i + 1 : i + 2]) for i in range(codes.shape[1] - 1)]
        return torch.cat(parts, dim=1).sum(1)

    # -- frames -------------------------------------------------------------------------

    def complete_frames(self, hidden: Tensor, first: Tensor, pick: CodePicker) -> Tensor:
        """Talker hidden ``[B, D]`` + codebook-0 codes ``[B]`` -> full frames ``[B, G]``."""
        first = first.to(self.device)
        rest = self.code_predictor.predict(
            hidden, self.embed_codec(first), pick, self.num_code_groups - 1
        )
        return torch.cat((first[:, None], rest), dim=1)

    # -- cache + forward ----------------------------------------------------------------

    def allocate_cache(self, max_slots: int, max_len: int) -> KVCache:
        """Allocate (once) a slot cache for ``max_slots`` streams of ``max_len`` positions."""
        c = self.config
        self.cache = KVCache(
            c.num_hidden_layers, max_slots, c.num_key_value_heads, max_len, c.head_dim,
            dtype=self.dtype, device=self.device,
        )
        return self.cache

    @torch.inference_mode()
    def forward_batch(self, slots: Sequence[int], embeds: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """Append ``embeds[i]`` (``[q_i, D]``, q_i >= 1) to slot ``slots[i]`` and run them.

        New tokens take positions ``lengths[slot] ..`` and see every earlier token of
        their slot (bottom-right-aligned causal mask); the slot's length then grows by
        ``q_i``. Rows are padded to the longest ``q_i`` (a long prefill in the same batch
        as one-frame decodes costs the decodes that padding). Returns the last new
        token's final hidden state ``[B, D]`` and its float32 codec logits ``[B, V]``.
        """
        cache = self.cache
        if cache is None:
            raise RuntimeError("no KV cache: call allocate_cache() first")
        if not slots or len(slots) != len(embeds):
            raise ValueError("slots and embeds must be non-empty and of equal length")
        if len(set(slots)) != len(slots):
            raise ValueError(f"duplicate slots in one step: {list(slots)}")
        counts = [int(e.shape[0]) for e in embeds]
        for slot, q in zip(slots, counts, strict=True):
            cache._check_slot(slot)
            if q < 1:
                raise ValueError(f"slot {slot}: no new positions")
            if cache.lengths[slot] + q > cache.max_len:
                raise ValueError(
                    f"slot {slot}: {cache.lengths[slot]} + {q} positions exceed max_len {cache.max_len}"
                )
        dev = self.device
        b, q_max = len(slots), max(counts)
        x = torch.zeros(b, q_max, self.config.hidden_size, dtype=self.dtype, device=dev)
        for i, e in enumerate(embeds):
            x[i, : counts[i]] = e.to(device=dev, dtype=self.dtype)

        starts = torch.tensor([cache.lengths[s] for s in slots], device=dev)
        last = torch.tensor(counts, device=dev) - 1
        t = torch.arange(q_max, device=dev)
        # Padded queries repeat the last real query (position and keys): finite, ignored.
        pos = starts[:, None] + torch.minimum(t[None, :], last[:, None])  # [B, Q]
        kv_len = max(cache.lengths[s] + q for s, q in zip(slots, counts, strict=True))
        k_pos = torch.arange(kv_len, device=dev).expand(b, kv_len)
        masks = _window_masks(self.windows, pos, k_pos)
        cos, sin = self.rope(pos, self.dtype)

        slot_t = torch.tensor(list(slots), device=dev)
        wb, wt, ws, wp = [], [], [], []
        for i, (slot, q) in enumerate(zip(slots, counts, strict=True)):
            start = cache.lengths[slot]
            wb += [i] * q
            wt += range(q)
            ws += [slot] * q
            wp += range(start, start + q)
        wb_t, wt_t, ws_t, wp_t = (torch.tensor(v, device=dev) for v in (wb, wt, ws, wp))

        def kv(layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            ck, cv = cache.k[layer], cache.v[layer]  # [S, Hkv, L, D]
            ck[ws_t, :, wp_t] = k[wb_t, :, wt_t]
            cv[ws_t, :, wp_t] = v[wb_t, :, wt_t]
            return (
                ck[:, :, :kv_len].index_select(0, slot_t),
                cv[:, :, :kv_len].index_select(0, slot_t),
            )

        h = x
        for layer, window in zip(self.model.layers, self.windows, strict=True):
            h = layer(h, cos, sin, masks[window], kv)
        h = self.model.norm(h[torch.arange(b, device=dev), last])
        for slot, q in zip(slots, counts, strict=True):
            cache.lengths[slot] += q
            cache.written[slot] = cache.lengths[slot]
        return h, self.codec_head(h).float()
