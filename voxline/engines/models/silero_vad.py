"""Silero VAD v6 (ONNX, shipped in the `silero-vad` package) run directly with onnxruntime.

The model is a small recurrent network: every call takes one 32 ms frame (512 samples at
16 kHz) per stream, preceded by the last 64 samples of that stream's previous frame, and
carries an LSTM state of shape [2, 128] per stream. `SileroVAD.process` runs one
onnxruntime call for a whole batch of streams; each stream keeps its own `VADState`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import onnxruntime as ort

from voxline.errors import ModelUnavailableError
from voxline.logs import timed

log = logging.getLogger(__name__)

_MODEL = "Silero VAD v6"
_PACKAGE = "silero-vad"
_RESOURCE = ("silero_vad", "data/silero_vad.onnx")

SAMPLE_RATE = 16000
FRAME = 512  # samples per call at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees before each frame
STATE_SIZE = 128


@dataclass
class VADState:
    """Per-stream recurrent state: LSTM state [2, 128] and the previous frame's tail [64]."""

    state: np.ndarray = field(default_factory=lambda: np.zeros((2, STATE_SIZE), np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))

    def reset(self) -> None:
        """Forget everything heard so far (start of a new stream)."""
        self.state[...] = 0.0
        self.context[...] = 0.0


def shipped_model_path() -> Path:
    """Path of the ONNX file inside the installed `silero-vad` package.

    Raises ModelUnavailableError when the package or the file is absent.
    """
    package, name = _RESOURCE
    try:
        path = Path(str(resources.files(package).joinpath(name)))
    except ModuleNotFoundError as exc:
        raise ModelUnavailableError(
            _MODEL, f"Python package '{_PACKAGE}'", f"pip install {_PACKAGE}"
        ) from exc
    if not path.is_file():
        raise ModelUnavailableError(
            _MODEL, f"{package}/{name}", f"reinstall the '{_PACKAGE}' package"
        )
    return path


class SileroVAD:
    """Speech probability per 32 ms frame for many streams at once (CPU, onnxruntime)."""

    FRAME = FRAME
    SAMPLE_RATE = SAMPLE_RATE

    def __init__(self, session: ort.InferenceSession, path: Path) -> None:
        self._session = session
        self.path = path
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    @classmethod
    def load(cls, path: str | None = None, threads: int = 1) -> SileroVAD:
        """Load the shipped model (or the ONNX file at `path`) with `threads` intra-op threads.

        Raises ModelUnavailableError when the file is missing.
        """
        model_path = shipped_model_path() if path is None else Path(path)
        if not model_path.is_file():
            raise ModelUnavailableError(_MODEL, str(model_path), "no such ONNX file")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        with timed(log, f"loading {_MODEL} from {model_path}"):
            session = ort.InferenceSession(
                str(model_path), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        return cls(session, model_path)

    def new_state(self) -> VADState:
        """A fresh state for one stream."""
        return VADState()

    def process(self, frames: np.ndarray, states: list[VADState]) -> np.ndarray:
        """Speech probabilities [B] for one 512-sample frame per stream ([B, 512] float32).

        Row i belongs to the stream of `states[i]`, which is updated in place. Rows are
        independent: a batch gives the same result as calling once per stream.
        """
        frames = np.asarray(frames, dtype=np.float32)
        if frames.ndim == 1:
            frames = frames[None]
        if frames.ndim != 2 or frames.shape[1] != FRAME:
            raise ValueError(f"frames must have shape [B, {FRAME}], got {list(frames.shape)}")
        if len(states) != frames.shape[0]:
            raise ValueError(f"{frames.shape[0]} frames but {len(states)} states")
        if not states:
            return np.zeros(0, np.float32)
        contexts = np.stack([s.context for s in states])
        x = np.concatenate([contexts, frames], axis=1)
        state = np.stack([s.state for s in states], axis=1)  # [2, B, 128]
        out, new_state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
        for i, s in enumerate(states):
            s.state[...] = new_state[:, i]
            s.context[...] = frames[i, -CONTEXT:]
        return np.asarray(out, dtype=np.float32).reshape(-1)

    def speech_probabilities(self, audio: np.ndarray) -> np.ndarray:
        """Probabilities for a whole 16 kHz clip, one per 512-sample frame (last one zero-padded).

        Starts from a fresh state; equals feeding the frames one by one through `process`.
        """
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        n = -(-len(audio) // FRAME)
        padded = np.zeros(n * FRAME, np.float32)
        padded[: len(audio)] = audio
        state = self.new_state()
        probs = np.empty(n, np.float32)
        for i in range(n):
            probs[i] = self.process(padded[i * FRAME : (i + 1) * FRAME][None], [state])[0]
        return probs
