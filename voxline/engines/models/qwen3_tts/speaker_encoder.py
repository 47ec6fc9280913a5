"""x-vector speaker encoder of the Base (voice clone) models: log-mel + ECAPA-TDNN.

:func:`mel_spectrogram` reproduces the reference front end (24 kHz, 1024-point Hann
STFT, hop 256, 128 Slaney mel bands up to 12 kHz, log of magnitudes clamped at 1e-5);
the mel filterbank is computed here with librosa's formulas and float32 rounding, so no
librosa is needed. :class:`SpeakerEncoder` mirrors the reference's ``speaker_encoder.*``
keys; its output (``enc_dim`` = talker width) is the voice's talker embedding.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import SpeakerEncoderConfig

__all__ = ["SpeakerEncoder", "mel_filterbank", "mel_spectrogram"]

_N_FFT = 1024
_HOP = 256
_N_MELS = 128
_FMAX = 12000.0


# --------------------------------------------------------------------------- front end


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_mel = 1000.0 / f_sp
    logstep = np.log(6.4) / 27.0
    log_region = f >= 1000.0
    mels[log_region] = min_log_mel + np.log(f[log_region] / 1000.0) / logstep
    return mels


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_mel = 1000.0 / f_sp
    logstep = np.log(6.4) / 27.0
    log_region = m >= min_log_mel
    freqs[log_region] = 1000.0 * np.exp(logstep * (m[log_region] - min_log_mel))
    return freqs


@functools.cache
def mel_filterbank(sr: int = 24000, n_fft: int = _N_FFT, n_mels: int = _N_MELS,
                   fmin: float = 0.0, fmax: float = _FMAX) -> np.ndarray:
    """Slaney-normalised triangular mel filters ``[n_mels, 1 + n_fft // 2]`` (float32)."""
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array([fmin]))[0], _hz_to_mel(np.array([fmax]))[0], n_mels + 2))
    fdiff = np.diff(edges)
    ramps = np.subtract.outer(edges, fft_freqs)
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, None]
    return weights


def mel_spectrogram(wav: Tensor, sr: int = 24000) -> Tensor:
    """Mono float waveform ``[T]`` or ``[B, T]`` at 24 kHz -> log-mel ``[B, frames, 128]``."""
    if sr != 24000:
        raise ValueError(f"the speaker encoder takes 24 kHz audio, got {sr} Hz (resample first)")
    y = wav.float()
    if y.dim() == 1:
        y = y[None]
    basis = torch.from_numpy(mel_filterbank(sr)).to(y.device)
    pad = (_N_FFT - _HOP) // 2
    y = F.pad(y[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(
        y, _N_FFT, hop_length=_HOP, win_length=_N_FFT, window=torch.hann_window(_N_FFT, device=y.device),
        center=False, normalized=False, onesided=True, return_complex=True,
    )
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ mag, min=1e-5)).transpose(1, 2)


# --------------------------------------------------------------------------- ECAPA-TDNN


def _conv(c_in: int, c_out: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNNBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNNBlock(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        outs: list[Tensor] = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                out = part
            elif i == 1:
                out = self.blocks[0](part)
            else:
                out = self.blocks[i - 1](part + outs[-1])
            outs.append(out)
        return torch.cat(outs, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * s


class SERes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(c_in, c_out, 1, 1)
        self.res2net_block = Res2NetBlock(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(c_out, c_out, 1, 1)
        self.se_block = SqueezeExcitation(c_out, se_channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPooling(nn.Module):
    """Attention-weighted mean and std over time (global context appended)."""

    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def _stats(self, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean[:, :, None]).pow(2)).sum(2).clamp(self.eps))
        return mean, std

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[-1]
        uniform = torch.ones(x.shape[0], 1, t, dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, uniform / uniform.sum(dim=2, keepdim=True))
        ctx = torch.cat((x, mean[:, :, None].repeat(1, 1, t), std[:, :, None].repeat(1, 1, t)), dim=1)
        attn = F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = self._stats(x, attn)
        return torch.cat((mean, std), dim=1)[:, :, None]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: log-mel ``[B, frames, mel_dim]`` -> embedding ``[B, enc_dim]``."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        ch, ks, ds = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        if not len(ch) == len(ks) == len(ds):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations differ in length")
        self.config = config
        self.blocks = nn.ModuleList([TDNNBlock(config.mel_dim, ch[0], ks[0], ds[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SERes2NetBlock(
                ch[i - 1], ch[i], config.enc_res2net_scale, config.enc_se_channels, ks[i], ds[i]
            ))
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp = AttentiveStatsPooling(ch[-1], config.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, config.enc_dim, 1)

    def forward(self, mels: Tensor) -> Tensor:
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[:, :, 0]

    @torch.inference_mode()
    def embed(self, wav: Tensor | np.ndarray, sr: int = 24000) -> Tensor:
        """Speaker embedding ``[enc_dim]`` of one mono waveform (24 kHz)."""
        wav_t = torch.as_tensor(np.asarray(wav, dtype=np.float32) if not isinstance(wav, Tensor) else wav)
        p = self.fc.weight
        return self(mel_spectrogram(wav_t.to(p.device), sr).to(p.dtype))[0]
