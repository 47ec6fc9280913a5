"""End-of-turn detection: false cut-offs and the wait after complete sentences, per detector.

The same utterances (the shipped Piper voice, seeded) go through the engine's own turn
code (`InputAudio` + `TurnDetector`, Silero VAD probabilities, 32 ms frames) under:

- `server_vad` (500 ms, OpenAI's default): silence alone;
- `rules`: semantic VAD over the pause transcript (Moonshine) alone;
- `model+rules`: semantic VAD with Smart Turn v3.2 (the engine's default when loaded).

At each pause (`TurnPaused`, 160 ms in) the pause transcript and the model's verdict
are computed for real and delivered on the audio clock after the wall time they took
(as in the engine, where both run on worker threads while audio keeps arriving at real
time); a verdict for a pause that speech resumed is void. Each is timed on its own, so
on a loaded machine the two also stand in for each other's contention.

Two sets: complete sentences followed by 4.5 s of silence (the wait = turn end minus the
last voiced frame), and sentences with a pause inside (a false cut-off = the turn ends
before the speaker's last word, in that pause or after it). Also prints the model's CPU
(thread) and wall ms per decision, p50/p95. A second table delivers every verdict at the
pause itself: the decisions alone, free of this machine's load.

    .venv/bin/python benchmarks/cpu_latency/bench_end_of_turn.py [--eagerness auto high] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np
import soxr

from voxline.engines.input_audio import InputAudio, TurnPaused, TurnResumed, TurnStopped
from voxline.engines.models.moonshine_asr import MoonshineASR
from voxline.engines.models.piper_tts import PiperTTS
from voxline.engines.models.silero_vad import SileroVAD
from voxline.engines.models.smart_turn import SmartTurn
from voxline.engines.protocol import TurnParams

RATE = 16_000
FRAME = 512
PAUSE_MS = 160.0  # the engine's pause transcript point (speculate_after_ms)
TAIL_MS = 4500  # silence after each utterance: past `auto`'s longest wait (4 s)

COMPLETE = [
    "What is the weather like in Paris today?",
    "Can you tell me a joke?",
    "Set a timer for ten minutes.",
    "I would like to book a table for four people.",
    "Thanks, that is all.",
    "How far is the moon from the earth?",
    "Please turn off the lights in the kitchen.",
    "What time does the train to London leave?",
    "My favourite colour is blue.",
    "Remind me to call my mother tomorrow.",
    "Who wrote the book about the white whale?",
    "Play some jazz music.",
]
# (before the pause, pause in ms, after it)
PAUSED = [
    ("I would like to book a table for,", 800, "four people tonight."),
    ("And then I went to the,", 1000, "store to buy some milk."),
    ("Can you tell me about,", 700, "the history of Rome?"),
    ("I need a flight to Boston,", 900, "leaving on Friday morning."),
    ("So I was thinking that,", 1200, "maybe we could go out for dinner."),
    ("What is the best way to,", 600, "learn to play the piano?"),
    ("My name is John,", 800, "and I live in Seattle."),
    ("Set an alarm for,", 1000, "seven in the morning."),
    ("I want to order a pizza with,", 700, "mushrooms and olives."),
    ("Tell me a story about a dragon and,", 900, "a brave little knight."),
    ("Um,", 1100, "what is the capital of Peru?"),
    ("The meeting is on Tuesday,", 600, "at three in the afternoon."),
]


@dataclass
class Utterance:
    name: str
    audio: np.ndarray
    speech_end_ms: float  # last voiced sample of the whole utterance
    pause: tuple[float, float] | None = None  # (start, end) ms of the inner pause


class Speaker:
    def __init__(self) -> None:
        self.tts = PiperTTS.load()

    def say(self, text: str) -> np.ndarray:
        audio = soxr.resample(self.tts.synthesize_all(text, seed=1), self.tts.sample_rate, RATE)
        voiced = np.nonzero(np.abs(audio) > 0.02)[0]
        return audio[voiced[0]: voiced[-1] + 1].astype(np.float32)


def silence(ms: float) -> np.ndarray:
    return np.zeros(int(ms * RATE / 1000), np.float32)


def utterances(speaker: Speaker) -> tuple[list[Utterance], list[Utterance]]:
    lead = 300.0
    complete = []
    for text in COMPLETE:
        speech = speaker.say(text)
        complete.append(Utterance(text, np.concatenate([silence(lead), speech, silence(TAIL_MS)]),
                                  lead + len(speech) * 1000 / RATE))
    paused = []
    for before, gap, after in PAUSED:
        a, b = speaker.say(before), speaker.say(after)
        start = lead + len(a) * 1000 / RATE
        audio = np.concatenate([silence(lead), a, silence(gap), b, silence(TAIL_MS)])
        paused.append(Utterance(f"{before} [{gap} ms] {after}", audio,
                                start + gap + len(b) * 1000 / RATE, (start, start + gap)))
    return complete, paused


class Judges:
    """The pause transcript and the model's verdict for a given turn-so-far, cached."""

    def __init__(self) -> None:
        self.asr = MoonshineASR.load(threads=1)
        self.model = SmartTurn.load(threads=1)
        self._cache: dict[tuple[str, int], tuple[str, float, float, float]] = {}
        self.model_cpu_ms: list[float] = []
        self.model_wall_ms: list[float] = []
        self.instant = False  # deliver verdicts at the pause itself (no compute time)

    def forget(self) -> None:
        """Drop cached verdicts, so the next run times them again."""
        self._cache.clear()

    def at_pause(self, key: str, audio: np.ndarray) -> tuple[str, float, float, float]:
        """(transcript, its wall ms, model probability, its wall ms)."""
        k = (key, len(audio))
        if k not in self._cache:
            t0 = time.perf_counter()
            text = self.asr.transcribe(audio)
            asr_ms = (time.perf_counter() - t0) * 1000
            c0, t0 = time.thread_time(), time.perf_counter()
            prob = self.model.probability(audio)
            model_ms = (time.perf_counter() - t0) * 1000
            self.model_cpu_ms.append((time.thread_time() - c0) * 1000)
            self.model_wall_ms.append(model_ms)
            self._cache[k] = (text, asr_ms, prob, model_ms)
        text, asr_ms, prob, model_ms = self._cache[k]
        return (text, 0.0, prob, 0.0) if self.instant else (text, asr_ms, prob, model_ms)


def vad_probs(vad: SileroVAD, audio: np.ndarray) -> list[float]:
    state = vad.new_state()
    n = len(audio) // FRAME
    return [float(vad.process(audio[i * FRAME:(i + 1) * FRAME][None], [state])[0]) for i in range(n)]


def turn_end_ms(utt: Utterance, probs: list[float], td: TurnParams, judges: Judges,
                use_words: bool, use_model: bool, pause_ms: float = PAUSE_MS) -> float | None:
    """When the first turn ends on the audio clock (None: it never ended), the pause
    transcript and verdict taken `pause_ms` into each pause."""
    inp = InputAudio(td, pause_ms=pause_ms)
    det = inp.detector
    assert det is not None
    due: list[tuple[float, str, object]] = []  # (audio ms, kind, value) for the current pause
    for i, prob in enumerate(probs):
        now = inp.audio_ms
        for item in [d for d in due if d[0] <= now]:
            due.remove(item)
            _, kind, value = item
            if kind == "words":
                det.judge(str(value))
            else:
                det.hear(float(value))  # type: ignore[arg-type]
        frame = utt.audio[i * FRAME:(i + 1) * FRAME]
        update = inp.on_frame(frame, prob, partials=False, partial_interval_ms=1000)
        if isinstance(update, TurnStopped):
            return inp.audio_ms
        if isinstance(update, TurnResumed):
            due.clear()
        if isinstance(update, TurnPaused) and td.eagerness is not None:
            text, asr_ms, p, model_ms = judges.at_pause(utt.name, update.utterance.audio())
            if use_words:
                due.append((inp.audio_ms + asr_ms, "words", text))
            if use_model:
                det.expect_sound()
                due.append((inp.audio_ms + model_ms, "sound", p))
    return None


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


Detector = tuple[str, TurnParams, bool, bool, float]  # name, params, words, model, pause ms


def table(detectors: list[Detector], complete: list[Utterance],
          paused: list[Utterance], probs: dict[str, list[float]], judges: Judges,
          repeats: int) -> None:
    """One row per detector, pooled over `repeats` runs (verdicts re-timed each run)."""
    print(f"{'detector':<22} {'false cut-offs':>15} {'wait p50 ms':>12} {'wait p95 ms':>12} "
          f"{'never ended':>12}")
    results = {name: ([], 0, 0) for name, *_ in detectors}
    for _ in range(repeats):
        judges.forget()
        for name, td, words, model, pause_ms in detectors:
            waits, never, cut = results[name]
            for u in complete:
                end = turn_end_ms(u, probs[u.name], td, judges, words, model, pause_ms)
                if end is None:
                    never += 1
                else:
                    waits.append(end - u.speech_end_ms)
            for u in paused:
                end = turn_end_ms(u, probs[u.name], td, judges, words, model, pause_ms)
                cut += end is not None and end < u.speech_end_ms  # ended before the speaker did
            results[name] = (waits, never, cut)
    for name, (waits, never, cut) in results.items():
        print(f"{name:<22} {f'{cut}/{len(paused) * repeats}':>15} {statistics.median(waits):>12.0f} "
              f"{pct(waits, 95):>12.0f} {never:>12}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eagerness", nargs="+", default=["auto", "high"])
    ap.add_argument("--repeats", type=int, default=1, help="runs pooled (verdicts re-timed)")
    ap.add_argument("--pause-ms", type=float, nargs="+", default=[PAUSE_MS],
                    help="where in a pause the semantic detectors judge it (one row each)")
    args = ap.parse_args()
    speaker, judges, vad = Speaker(), Judges(), SileroVAD.load(threads=1)
    complete, paused = utterances(speaker)
    probs = {u.name: vad_probs(vad, u.audio) for u in complete + paused}
    detectors: list[Detector] = [
        ("server_vad 500 ms", TurnParams(silence_duration_ms=500), False, False, PAUSE_MS)]
    for e in args.eagerness:
        for pause in args.pause_ms:
            at = "" if len(args.pause_ms) == 1 else f" @{pause:.0f}"
            detectors += [(f"rules ({e}){at}", TurnParams(eagerness=e), True, False, pause),
                          (f"model+rules ({e}){at}", TurnParams(eagerness=e), True, True, pause)]
    print(f"{len(complete)} complete sentences, {len(paused)} with a pause inside "
          f"({min(g for _, g, _ in PAUSED)}-{max(g for _, g, _ in PAUSED)} ms)\n")
    print("verdicts land after the wall time they took here:")
    table(detectors, complete, paused, probs, judges, args.repeats)
    print("\nverdicts land at once (the decisions alone, as on an idle or faster machine):")
    judges.instant = True
    table(detectors, complete, paused, probs, judges, 1)
    print(f"\nSmart Turn per decision ({len(judges.model_cpu_ms)} decisions): CPU ms p50 "
          f"{pct(judges.model_cpu_ms, 50):.1f} / p95 {pct(judges.model_cpu_ms, 95):.1f}; "
          f"wall ms p50 {pct(judges.model_wall_ms, 50):.1f} / p95 {pct(judges.model_wall_ms, 95):.1f}")


if __name__ == "__main__":
    main()
