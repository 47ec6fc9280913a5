"""A plain PyTorch Llama with a static, slot-based KV cache (continuous batching).

The module tree and parameter names match transformers' ``LlamaForCausalLM``, so its
state dict loads unchanged (``model.embed_tokens``, ``model.layers.N.self_attn.q_proj``,
... , ``lm_head``; a tied ``lm_head`` may be absent from the state dict).

The cache is allocated once (:class:`KVCache`). Each stream owns one slot;
``lengths[slot]`` counts the tokens whose K/V are in the cache and confirmed. One call
to :meth:`LlamaModel.forward_batch` runs several slots at once, each with its own number
of new tokens, so prefill chunks and one-token decodes share a step. The new tokens of a
slot sit at positions ``lengths[slot] .. lengths[slot] + q - 1`` and query ``i`` of a
chunk sees keys ``0 .. lengths[slot] + i`` (a bottom-right-aligned causal mask).

Confirming and discarding tokens: a token that was sampled but not yet fed needs no
undo (just don't feed it). A token that was fed and must go (a stale decode step, a
barge-in rollback) is undone with :meth:`KVCache.truncate`. A step can also be run with
``advance=False`` and confirmed later with :meth:`KVCache.commit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxline.engines.models.kv_cache import KVCache
from voxline.engines.models.layers import MLP, RMSNorm
from voxline.kernels.int8_linear import Int8Linear, quantize_linears
from voxline.kernels.layer_ops import apply_rope, rope_tables

__all__ = ["Attention", "DecoderLayer", "LlamaModel", "StepPlan"]


# --------------------------------------------------------------------------- layers


@dataclass
class StepPlan:
    """Index tensors shared by every layer of one forward step."""

    cos: Tensor  # [B, 1, Q, D]
    sin: Tensor
    mask: Tensor  # [B, 1, Q, K] bool, True = may attend
    kv_len: int = 0
    slot_index: Tensor | None = None  # [B] cache slots of the batch rows
    slot_range: tuple[int, int] | None = None  # slots are start..stop-1 in order: use a view
    write_b: Tensor | None = None  # [N] batch row of each real new token
    write_t: Tensor | None = None  # [N] its query index
    write_slot: Tensor | None = None  # [N] its cache slot
    write_pos: Tensor | None = None  # [N] its cache position
    last_t: Tensor | None = None  # [B] query index of each row's last real token


class Attention(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = _head_dim(config)
        bias = bool(getattr(config, "attention_bias", False))
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)

    def forward(self, x: Tensor, plan: StepPlan, cache: KVCache | None) -> Tensor:
        b, q_len, _ = x.shape
        q = self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, plan.cos, plan.sin), apply_rope(k, plan.cos, plan.sin)
        if cache is not None:
            ck, cv = cache.k[self.layer_idx], cache.v[self.layer_idx]  # [S, Hkv, L, D]
            # Only real (non-padded) tokens are written: [N, Hkv, D] at (slot, :, pos).
            ck[plan.write_slot, :, plan.write_pos] = k[plan.write_b, :, plan.write_t]
            cv[plan.write_slot, :, plan.write_pos] = v[plan.write_b, :, plan.write_t]
            if plan.slot_range is not None:
                start, stop = plan.slot_range
                k = ck[start:stop, :, : plan.kv_len]
                v = cv[start:stop, :, : plan.kv_len]
            else:
                k = ck[:, :, : plan.kv_len].index_select(0, plan.slot_index)
                v = cv[:, :, : plan.kv_len].index_select(0, plan.slot_index)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=plan.mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))




class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, plan: StepPlan, cache: KVCache | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), plan, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


# --------------------------------------------------------------------------- config facts


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_parameters(config) -> dict:
    """RoPE settings from a transformers 5 (``rope_parameters``) or 4 (``rope_theta``) config."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    scaling["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return scaling


def _rope_inv_freq(config) -> tuple[Tensor, float]:
    """Inverse frequencies and cos/sin scale. Length-dependent variants are refused."""
    params = _rope_parameters(config)
    rope_type = params.get("rope_type", "default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("partial rotary embeddings are not supported")
    if rope_type == "default":
        dim = _head_dim(config)
        exponents = torch.arange(0, dim, 2, dtype=torch.float) / dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    if rope_type in ("linear", "llama3", "yarn"):
        # Static (position-independent) scalings: reuse transformers' published formulas.
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
        return inv_freq.float(), float(scale)
    raise NotImplementedError(f"rope_type {rope_type!r} is not supported")


# --------------------------------------------------------------------------- model


class LlamaModel(nn.Module):
    """Llama decoder + LM head. Attach a cache with :meth:`allocate_cache` before stepping."""

    def __init__(self, config) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {config.hidden_act!r} is not supported")
        self.config = config
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = _head_dim(config)
        self.model = _Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Kept float32 and out of the module's buffers so that .to(bfloat16) leaves it alone.
        self.inv_freq, self.rope_scale = _rope_inv_freq(config)
        self.cache: KVCache | None = None

    @classmethod
    def from_state_dict(
        cls,
        config,
        state_dict: dict[str, Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> LlamaModel:
        """Build from a ``LlamaForCausalLM`` state dict (strict; tied ``lm_head`` optional)."""
        with torch.device("meta"):
            model = cls(config)
        sd = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
        if model.tied:
            sd.pop("lm_head.weight", None)
        model.load_state_dict(sd, strict=False, assign=True)
        expected = {k for k in model.state_dict() if not (model.tied and k == "lm_head.weight")}
        missing = sorted(expected - sd.keys())
        unexpected = sorted(sd.keys() - expected)
        if missing or unexpected:
            raise ValueError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        if model.tied:
            model.lm_head.weight = model.model.embed_tokens.weight
        model = model.to(device=device, dtype=dtype).eval()
        model.inv_freq = _rope_inv_freq(config)[0].to(device)  # was built on meta above
        return model

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' (and KV cache's) dtype; int8 linears keep float32 activations."""
        return self.model.norm.weight.dtype

    def quantize_int8(self, *, dynamic_prefill: bool = False) -> LlamaModel:
        """Decode from int8 weights in every linear, the LM head included (CPU, in place).

        Decoding is memory-bound on a CPU: a quarter of the bytes per token is most of the
        win. Activations, norms, attention and the KV cache stay float32; prefill steps read
        the int8 weights too where that is faster on this CPU (see
        :mod:`voxline.kernels.int8_linear`). With ``dynamic_prefill`` the decoder layers'
        prefill steps quantize their activations to int8 too; the LM head never does (the
        next token is picked from its output).
        """
        if self.device.type != "cpu" or self.dtype != torch.float32:
            raise ValueError(f"int8 weights need a float32 model on the CPU, not "
                             f"{self.dtype} on {self.device}")
        quantize_linears(self.model.layers, dynamic_prefill=dynamic_prefill)
        self.lm_head = Int8Linear(self.lm_head)
        return self

    def allocate_cache(self, max_slots: int, max_len: int) -> KVCache:
        """Allocate (once) and attach a cache of ``max_slots`` streams x ``max_len`` tokens."""
        self.cache = KVCache(
            self.config.num_hidden_layers,
            max_slots,
            self.num_kv_heads,
            max_len,
            self.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        return self.cache

    # -- rope / plan ------------------------------------------------------------------

    def _cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        return rope_tables(positions, self.inv_freq, self.dtype, self.rope_scale)

    def _plan(self, slots: Sequence[int], counts: Sequence[int], cache: KVCache) -> StepPlan:
        dev = self.device
        starts = [cache.lengths[s] for s in slots]
        q_max = max(counts)
        kv_len = max(st + q for st, q in zip(starts, counts, strict=True))
        lens = torch.tensor(starts, device=dev)[:, None]
        last_t = torch.tensor(counts, device=dev) - 1
        last = last_t[:, None]
        t = torch.arange(q_max, device=dev)[None, :]
        # Padded queries reuse the last real query's position and keys: finite, ignored.
        positions = lens + torch.minimum(t, last)  # [B, Q]
        mask = torch.arange(kv_len, device=dev)[None, None, :] <= positions[..., None]
        cos, sin = self._cos_sin(positions)
        write_b, write_t, write_slot, write_pos = [], [], [], []
        for b, (slot, st, q) in enumerate(zip(slots, starts, counts, strict=True)):
            write_b += [b] * q
            write_t += range(q)
            write_slot += [slot] * q
            write_pos += range(st, st + q)
        first = slots[0]
        contiguous = list(slots) == list(range(first, first + len(slots)))

        def idx(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.long, device=dev)

        return StepPlan(
            cos=cos,
            sin=sin,
            mask=mask.unsqueeze(1),
            kv_len=kv_len,
            slot_index=idx(list(slots)),
            slot_range=(first, first + len(slots)) if contiguous else None,
            write_b=idx(write_b),
            write_t=idx(write_t),
            write_slot=idx(write_slot),
            write_pos=idx(write_pos),
            last_t=last_t,
        )

    # -- forward ----------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, input_ids: Tensor) -> Tensor:
        """Cache-free causal forward over whole sequences: ``[B, T]`` ids -> float32 ``[B, T, V]``."""
        b, t = input_ids.shape
        positions = torch.arange(t, device=self.device).expand(b, t)
        cos, sin = self._cos_sin(positions)
        mask = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()
        plan = StepPlan(cos=cos, sin=sin, mask=mask)
        return self.logits(self.hidden(input_ids.to(self.device), plan, None))

    def hidden(self, ids: Tensor, plan: StepPlan, cache: KVCache | None) -> Tensor:
        """The last layer's hidden states ``[B, Q, H]`` of ``ids [B, Q]`` under ``plan``
        (K/V written to ``cache`` as the plan says)."""
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h, plan, cache)
        return h

    def logits(self, h: Tensor) -> Tensor:
        """Float32 logits of final hidden states ``h [..., H]``."""
        return self.lm_head(self.model.norm(h)).float()

    def check_step(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> KVCache:
        """Validate one step's slots and new tokens (see :meth:`forward_batch`); the cache."""
        cache = self.cache
        if cache is None:
            raise RuntimeError("no KV cache: call allocate_cache() first")
        if len(slots) != len(tokens) or not slots:
            raise ValueError("slots and tokens must be non-empty and of equal length")
        if len(set(slots)) != len(slots):
            raise ValueError(f"duplicate slots in one step: {list(slots)}")
        vocab = self.config.vocab_size
        for slot, toks in zip(slots, tokens, strict=True):
            cache._check_slot(slot)
            q = len(toks)
            if q == 0:
                raise ValueError(f"slot {slot}: no new tokens")
            if min(toks) < 0 or max(toks) >= vocab:  # on a GPU this would be a device assert
                raise ValueError(f"slot {slot}: token id outside [0, {vocab})")
            if cache.lengths[slot] + q > cache.max_len:
                raise ValueError(
                    f"slot {slot}: {cache.lengths[slot]} + {q} tokens exceed max_len {cache.max_len}"
                )
        return cache

    @torch.inference_mode()
    def forward_batch(
        self,
        slots: Sequence[int],
        tokens: Sequence[Sequence[int]],
        *,
        all_logits: bool = False,
        advance: bool = True,
    ) -> Tensor:
        """One step for several cache slots, each feeding its own number of new tokens.

        ``slots`` must be distinct and every ``tokens[i]`` non-empty; a slot's new tokens
        must fit in ``max_len``. Their K/V are written at ``lengths[slot]..``; with
        ``advance`` (default) ``lengths[slot]`` then grows by ``len(tokens[i])``, otherwise it
        stays and the caller confirms with :meth:`KVCache.commit`. Padded positions are
        never written. Returns float32 logits of each slot's last new token ``[B, V]``,
        or with ``all_logits`` every position ``[B, max_q, V]`` (rows past a slot's count
        are padding, unspecified).
        """
        cache = self.check_step(slots, tokens)
        counts = [len(toks) for toks in tokens]
        q_max = max(counts)
        ids = torch.zeros(len(slots), q_max, dtype=torch.long)
        for b, toks in enumerate(tokens):
            ids[b, : len(toks)] = torch.as_tensor(toks, dtype=torch.long)
        plan = self._plan(slots, counts, cache)

        h = self.hidden(ids.to(self.device), plan, cache)
        if not all_logits:
            h = h[torch.arange(len(slots), device=self.device), plan.last_t]
        logits = self.logits(h)

        for slot, q in zip(slots, counts, strict=True):
            cache.written[slot] = cache.lengths[slot] + q
            if advance:
                cache.lengths[slot] += q
        return logits
