"""Moonshine's greedy decoding over static buffers: one CUDA graph per batch shape.

Eager transformers decoding costs ~300 kernel launches of Python per token; on a server
that Python holds the GIL the TTS and LLM threads need. Here a decoding step is a fixed
function of preallocated buffers, so on a GPU it is captured once per (rows, frames)
bucket and replayed; on the CPU the same function runs eagerly (the eager twin).

Buffers (all zero-initialised, so masked entries are finite and weigh exactly nothing):
- self-attention K/V ``[layers, rows, heads, positions, head_dim]``: the step writes
  position ``pos`` and attends to positions ``<= pos`` (an additive mask from ``pos``);
- cross-attention K/V ``[layers, rows, heads, frames, head_dim]``, projected once per
  batch from the encoder states (`prime`), with an additive mask over each row's frames;
- the tokens fed and the position, copied in before each replay.
A batch is padded to its bucket: extra rows decode <s> over no frames, extra frames are
masked. A batch past the largest bucket (rows, frames or positions) gets buffers of its
own, exactly its size, run eagerly: the same function, only not captured.

Each step is the transformers decoder layer's arithmetic on the same modules (layer
norms, projections, rotary embedding, SwiGLU MLP), so the tokens are the eager model's;
a test compares them with onnxruntime's on the CPU. One replay runs `TOKENS_PER_REPLAY`
steps, each feeding the one before's pick, so the host reads the picks (a stream sync,
and the GIL given up and won back) once per four tokens rather than every token; the
self-attention buffers hold `TOKENS_PER_REPLAY - 1` positions more, for the steps a
replay runs past the longest budget, whose picks are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn.functional import scaled_dot_product_attention

from voxline.kernels.cuda_graphs import BucketedSteps, StaticStep, bucket_for, pow2_buckets

log = logging.getLogger(__name__)

FRAME_BUCKETS = (64, 128, 256, 384, 512, 768)  # encoder frames (41.7 per second): 18.4 s
POSITIONS = 128  # decoded tokens + <s>: the budget of an 18.4 s clip is 126
TOKENS_PER_REPLAY = 4


class StaticDecoder:
    """Greedy decoding for up to `rows` clips of up to `frames` encoder frames."""

    def __init__(self, decoder: torch.nn.Module, proj_out: torch.nn.Module, *, rows: int,
                 frames: Sequence[int] = FRAME_BUCKETS, positions: int = POSITIONS,
                 capture: bool) -> None:
        """`decoder` and `proj_out`: the transformers model's ``model.decoder`` and LM head."""
        self.decoder = decoder
        self.proj_out = proj_out
        first = self.decoder.layers[0].self_attn
        self.heads, self.head_dim = first.config.num_attention_heads, first.head_dim
        layers = len(self.decoder.layers)
        weight = self.proj_out.weight
        device, dtype = weight.device, weight.dtype
        self.row_buckets = pow2_buckets(1, rows)
        self.frame_buckets = sorted(frames)
        self.positions = positions
        room = positions + TOKENS_PER_REPLAY - 1  # a replay's steps past the last position
        shape = (layers, rows, self.heads)
        self.k = torch.zeros(*shape, room, self.head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.xk = torch.zeros(*shape, self.frame_buckets[-1], self.head_dim, device=device,
                              dtype=dtype)
        self.xv = torch.zeros_like(self.xk)
        self.cross_mask = torch.zeros(rows, 1, 1, self.frame_buckets[-1], device=device,
                                      dtype=dtype)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self._range = torch.arange(room, device=device)
        self.steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make, capture=capture, name="Moonshine decoder graphs")

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.k, self.v, self.xk, self.xv, self.cross_mask))

    def keys(self) -> list[tuple[int, int]]:
        return [(r, f) for r in self.row_buckets for f in self.frame_buckets]

    def fits(self, rows: int, frames: int, steps: int) -> bool:
        return (rows <= self.row_buckets[-1] and frames <= self.frame_buckets[-1]
                and steps <= self.positions)

    def _make(self, key: tuple[int, int]) -> StaticStep:
        rows, frames = key
        return StaticStep(self._step, {
            "tokens": self.tokens[:rows], "pos": self.pos, "k": self.k[:, :rows],
            "v": self.v[:, :rows], "xk": self.xk[:, :rows, :, :frames],
            "xv": self.xv[:, :rows, :, :frames],
            "cross_mask": self.cross_mask[:rows, :, :, :frames]})

    def _heads(self, x: Tensor) -> Tensor:
        """[rows, n, hidden] -> [rows, heads, n, head_dim]."""
        return x.view(x.shape[0], -1, self.heads, self.head_dim).transpose(1, 2)

    def _step(self, tokens: Tensor, pos: Tensor, k: Tensor, v: Tensor, xk: Tensor, xv: Tensor,
              cross_mask: Tensor) -> dict[str, Tensor]:
        """`TOKENS_PER_REPLAY` greedy steps from `tokens` at `pos`: their picks ``[rows, n]``
        and the picks' log-probabilities (one reduction over logits each step computes)."""
        picks, logprobs = [], []
        for i in range(TOKENS_PER_REPLAY):
            tokens, logprob = self._one(tokens, pos + i, k, v, xk, xv, cross_mask)
            picks.append(tokens)
            logprobs.append(logprob)
        return {"next": torch.cat(picks, dim=1), "logprob": torch.cat(logprobs, dim=1)}

    def _one(self, tokens: Tensor, pos: Tensor, k: Tensor, v: Tensor, xk: Tensor, xv: Tensor,
             cross_mask: Tensor) -> tuple[Tensor, Tensor]:
        """One greedy step: each row's pick ``[rows, 1]`` after `tokens` at position `pos`,
        and its log-probability ``[rows, 1]``."""
        from transformers.models.moonshine.modeling_moonshine import apply_rotary_pos_emb

        dec = self.decoder
        h = dec.embed_tokens(tokens)
        cos, sin = dec.rotary_emb(h, position_ids=pos.view(1, 1))
        self_mask = torch.zeros(self._range.shape[0], device=h.device, dtype=h.dtype).masked_fill(
            self._range > pos, torch.finfo(h.dtype).min).view(1, 1, 1, -1)
        merge = (h.shape[0], 1, self.heads * self.head_dim)
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, key = apply_rotary_pos_emb(self._heads(attn.q_proj(x)),
                                          self._heads(attn.k_proj(x)), cos, sin)
            k[i].index_copy_(2, pos, key)
            v[i].index_copy_(2, pos, self._heads(attn.v_proj(x)))
            out = scaled_dot_product_attention(q, k[i], v[i], attn_mask=self_mask,
                                               scale=attn.scaling)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(merge))
            cross = layer.encoder_attn
            q = self._heads(cross.q_proj(layer.post_attention_layernorm(h)))
            out = scaled_dot_product_attention(q, xk[i], xv[i], attn_mask=cross_mask,
                                               scale=cross.scaling)
            h = h + cross.o_proj(out.transpose(1, 2).reshape(merge))
            h = h + layer.mlp(layer.final_layernorm(h))
        logits = self.proj_out(dec.norm(h))[:, -1].float()
        top, pick = logits.max(-1, keepdim=True)
        return pick, top - torch.logsumexp(logits, -1, keepdim=True)

    def _prime(self, rows: int, frames: int, states: Tensor, valid: Tensor, bos: int) -> None:
        """The batch's cross-attention K/V and mask into the (rows, frames) bucket's views."""
        n, width = states.shape[:2]
        for i, layer in enumerate(self.decoder.layers):
            cross = layer.encoder_attn
            self.xk[i, :n, :, :width] = self._heads(cross.k_proj(states))
            self.xv[i, :n, :, :width] = self._heads(cross.v_proj(states))
        mask = self.cross_mask[:rows, :, :, :frames]
        mask.fill_(torch.finfo(mask.dtype).min)
        mask[:n, 0, 0, :width].masked_fill_(valid, 0.0)
        self.tokens[:rows].fill_(bos)

    def decode(self, states: Tensor, valid: Tensor, budgets: Sequence[int], *, bos: int,
               eos: int) -> list[list[int]]:
        """Greedy tokens per row of encoder `states` [rows, frames, hidden] (`valid`: each
        row's own frames), each cut at `eos` or its budget."""
        return self.decode_scored(states, valid, budgets, bos=bos, eos=eos, scored=False)[0]

    @torch.inference_mode()
    def decode_scored(self, states: Tensor, valid: Tensor, budgets: Sequence[int], *, bos: int,
                      eos: int, scored: bool = True) -> tuple[list[list[int]], list[list[float]]]:
        """`decode`, and with `scored` each kept token's log-probability (else no lists)."""
        n, width = states.shape[:2]
        steps = max(budgets) + 1
        if not self.fits(n, width, steps):  # past the buckets: exact-size buffers, eager
            alone = StaticDecoder(self.decoder, self.proj_out, rows=n, frames=(width,),
                                  positions=steps, capture=False)
            return alone.decode_scored(states, valid, budgets, bos=bos, eos=eos, scored=scored)
        key = (bucket_for(n, self.row_buckets), bucket_for(width, self.frame_buckets))
        assert key[0] is not None and key[1] is not None
        key = self.steps.ready(key)  # a bucket captured in the background: padded up meanwhile
        self._prime(*key, states, valid, bos)
        step = self.steps.get(key)
        rows: list[list[int]] = [[] for _ in range(n)]
        scores: list[list[float]] = [[] for _ in range(n)] if scored else []
        done = [False] * n
        for position in range(0, steps, TOKENS_PER_REPLAY):
            self.pos.fill_(position)
            result = step()
            out = result["next"]
            logprobs = result["logprob"][:n].T.tolist() if scored else None
            for j, picks in enumerate(out[:n].T.tolist()):  # one step's picks, then the next's
                for i, token in enumerate(picks):
                    if done[i]:
                        continue
                    if token == eos or len(rows[i]) >= budgets[i]:
                        done[i] = True
                    else:
                        rows[i].append(token)
                        if logprobs is not None:
                            scores[i].append(logprobs[j][i])
            if all(done):
                break
            self.tokens[:key[0]].copy_(out[:, -1:])
        return rows, scores

