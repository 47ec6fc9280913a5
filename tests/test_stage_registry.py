"""A registered stage (`voxline.engines.stage_registry`) reaches the core through its one
registration: its table rows, the engine inputs it handles, its stream-closed hook, its
model's warm-up and GPU footprint. The core names no registered stage."""

from __future__ import annotations

from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS

from voxline.config import Settings
from voxline.engines import core as core_module
from voxline.engines import protocol as p
from voxline.engines.capacity import Footprint
from voxline.engines.core import EngineCore, Models
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.engines.stage import StageWorker
from voxline.engines.stage_registry import STAGES, StagePart, StageRegistration
from voxline.engines.stage_table import StageSlot


class ToyStage:
    """A stage with no work of its own."""

    def has_work(self) -> bool:
        return False

    def schedule(self) -> None:
        return None

    def execute(self, plan: object) -> None:
        return None

    def update(self, plan: object, result: object) -> None:
        return None


def _models(**stages: object) -> Models:
    return Models(EnergyVAD(), FixedASR(), CountingLM(), SentenceSpeechModel(ToneTTS()),
                  stages=dict(stages))


def test_a_new_stage_is_one_registration(monkeypatch) -> None:
    seen: list[tuple[str, object]] = []

    def attach(ctx, model) -> StagePart:
        stage = ToyStage()
        return StagePart(owner=model, rows=[StageSlot(
            "toy", stage, StageWorker(stage, ctx.wake, "voxline-toy"),
            route=lambda *a: None, fail=lambda *a: None)],
            handlers={p.CancelVideo: lambda stream, msg: seen.append(("input", msg.video_id))},
            closed=lambda stream: seen.append(("closed", stream.external_id)))

    toy = StageRegistration("toy", load=lambda settings: "toy model", attach=attach)
    monkeypatch.setattr(core_module, "STAGES", (*STAGES, toy))
    core = EngineCore(_models(toy="toy model"), lambda: None)
    try:
        assert [slot.name for slot in core.table][-1] == "toy"  # after the pipeline's rows
        assert core.parts["toy"].owner == "toy model"
        core.add_input(p.OpenStream("s1", p.StreamConfig()))
        core.add_input(p.CancelVideo("s1", "v1"))  # the registered handler takes it
        core.add_input(p.CloseStream("s1"))
        assert seen == [("input", "v1"), ("closed", "s1")]
    finally:
        core.close()


def test_registered_stages_without_a_model_add_no_row_and_videos_are_refused() -> None:
    core = EngineCore(_models(), lambda: None)
    try:
        names = [slot.name for slot in core.table]
        assert names == ["vad", "llm", "asr", "tts"]
        core.add_input(p.OpenStream("s1", p.StreamConfig()))
        core.add_input(p.CreateVideo("s1", "v1", "a cat"))
        [error] = [o for o in core.step() if isinstance(o, p.StreamError)]
        assert "--video helios:" in error.message
    finally:
        core.close()


def test_a_registered_footprint_joins_the_gpu_plan(monkeypatch) -> None:
    from voxline.engines import sizing

    big = Footprint(weights=1 << 30, parts=("toy",))
    toy = StageRegistration("toy", load=lambda s: None, attach=lambda ctx, m: StagePart(None),
                            footprint=lambda settings, gpu_in_use: ("cuda", big))
    monkeypatch.setattr(sizing, "STAGES", (toy,))
    monkeypatch.setattr(sizing, "cuda_device", lambda field, device: "cuda:0")
    on, _ = sizing.gpu_footprints(Settings())
    assert on == {"cuda:0": big}
