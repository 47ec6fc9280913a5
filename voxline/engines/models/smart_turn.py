"""Smart Turn v3.2 (ONNX, shipped inside the `pipecat-ai` wheel) run directly with onnxruntime.

The model is a Whisper-tiny encoder with a classifier head: it hears the last 8 s of a
turn (16 kHz mono) and says how likely the speaker sounds finished, from prosody alone
(intonation, lengthening, a trailing "and..."), not from the words. Its input is
Whisper's log-mel spectrogram, 80 bins x 800 frames of 10 ms; a turn shorter than 8 s is
zero-padded at the *start*, so the end of speech always sits at the end of the window.
Features are transformers' `WhisperFeatureExtractor`'s, configured here (nothing is
fetched), with the waveform normalised to zero mean and unit variance first, as the
model was trained. The extractor's own STFT loops over frames (about 80 ms a window on
these cores), so `input_features` computes the same spectrogram in one vectorised FFT
over the extractor's mel filter bank; `reference_features` is the extractor's call, and a
test holds the two equal. The output is already a probability (a sigmoid in the graph).

Only the ONNX file is used: pipecat's own runtime (and its dependency tree) is never
imported, so `pipecat-ai` is installed without dependencies (`scripts/setup.sh`). The
file is found through the package's installed metadata, which imports nothing.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from voxline.errors import ModelUnavailableError
from voxline.logs import timed

log = logging.getLogger(__name__)

_MODEL = "Smart Turn v3.2 (end-of-turn model)"
_PACKAGE = "pipecat-ai"
_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
_INSTALL_HINT = f"pip install --no-deps '{_PACKAGE}==1.14.0' (only its ONNX file is used)"

SAMPLE_RATE = 16000
WINDOW_S = 8  # the model hears the last 8 s of the turn
WINDOW = WINDOW_S * SAMPLE_RATE
MEL_BINS = 80
FRAMES = 800  # 10 ms hops over the 8 s window
_N_FFT, _HOP = 400, 160


def shipped_model_path() -> Path:
    """Path of the ONNX file inside the installed `pipecat-ai` wheel.

    Raises ModelUnavailableError (naming the package and how to install it) when the
    package or the file is absent.
    """
    try:
        dist = importlib.metadata.distribution(_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelUnavailableError(_MODEL, f"Python package '{_PACKAGE}'", _INSTALL_HINT) from exc
    path = Path(str(dist.locate_file(_FILE)))
    if not path.is_file():
        raise ModelUnavailableError(_MODEL, f"{path} (in package '{_PACKAGE}')", _INSTALL_HINT)
    return path


def window(audio: np.ndarray) -> np.ndarray:
    """The last `WINDOW_S` seconds of `audio`, zero-padded at the start to exactly that."""
    audio = np.asarray(audio, np.float32).reshape(-1)[-WINDOW:]
    if len(audio) < WINDOW:
        audio = np.concatenate([np.zeros(WINDOW - len(audio), np.float32), audio])
    return audio


class SmartTurn:
    """`probability(audio)`: how likely the turn in `audio` (16 kHz float32) has ended."""

    def __init__(self, session: ort.InferenceSession) -> None:
        from transformers import WhisperFeatureExtractor

        self.session = session
        (inp,) = session.get_inputs()
        self._input = inp.name
        bins, frames = inp.shape[1], inp.shape[2]
        if (bins, frames) != (MEL_BINS, FRAMES):
            raise ValueError(f"{_MODEL}: expected input_features [batch, {MEL_BINS}, {FRAMES}], "
                             f"the ONNX file has {list(inp.shape)}")
        self.features = WhisperFeatureExtractor(
            feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=_HOP,
            chunk_length=WINDOW_S, n_fft=_N_FFT, padding_value=0.0)
        self._hann = np.hanning(_N_FFT + 1)[:-1]  # periodic, as the extractor's

    @classmethod
    def load(cls, path: str | Path | None = None, threads: int = 1) -> SmartTurn:
        """Load the shipped model (or the ONNX file at `path`); raises ModelUnavailableError
        when the package is missing."""
        path = Path(path) if path is not None else shipped_model_path()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        with timed(log, f"loading {_MODEL} from {path}"):
            session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return cls(session)

    def reference_features(self, audio: np.ndarray) -> np.ndarray:
        """Log-mel features [1, 80, 800] of the last 8 s of `audio`, by the extractor itself."""
        feats = self.features(window(audio), sampling_rate=SAMPLE_RATE, return_tensors="np",
                              padding="max_length", max_length=WINDOW, truncation=True,
                              do_normalize=True)
        return np.asarray(feats["input_features"], np.float32)

    def input_features(self, audio: np.ndarray) -> np.ndarray:
        """`reference_features`, computed with one vectorised FFT (Whisper's recipe: a
        centred, reflect-padded 400-point periodic-Hann STFT every 160 samples, power
        spectrum through the mel filters, log10, floored 8 below the peak, scaled)."""
        x = window(audio).astype(np.float64)
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
        x = np.pad(x, _N_FFT // 2, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(x, _N_FFT)[::_HOP]
        power = np.abs(np.fft.rfft(frames * self._hann, axis=-1)) ** 2
        log_mel = np.log10(np.maximum(power @ self.features.mel_filters, 1e-10)).T[:, :FRAMES]
        log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
        return ((log_mel + 4.0) / 4.0)[None].astype(np.float32)

    def probability(self, audio: np.ndarray) -> float:
        """How likely the speaker sounds finished at the end of `audio` (0..1)."""
        (out,) = self.session.run(None, {self._input: self.input_features(audio)})
        return float(np.asarray(out).reshape(-1)[0])
