"""Registered voices on disk: one directory, which every server behind a balancer can share.

Layout: ``<dir>/<name>.json`` (a voice's metadata, ``name`` lower-cased: names are
case-insensitive) naming its clip ``<dir>/clip-<uuid>.f32`` (float32 LE mono at the
reference rate, normalised). The metadata file is the voice's existence: the clip is
written first under its unique name, then the metadata is written to a temporary file
and linked into place with ``os.link``, which fails if the name is taken, so two servers
registering one name at once cannot both win and a reader never finds metadata without
its clip. Removal unlinks the metadata first. Nothing is cached: every lookup reads
the directory, so a voice registered on one server is seen by the next lookup on any
other. That is the whole protocol, so a directory on shared storage (NFS, a mounted
volume) is a networked store with no extra process.

Blocking file I/O: call it off the event loop (``asyncio.to_thread``), except `exists`
(one ``stat``). A missing or unreadable directory raises `VoiceStoreError`.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxline.engines import protocol as p
from voxline.engines.models.qwen3_tts.reference import REFERENCE_RATE

__all__ = ["StoredVoice", "VoiceExists", "VoiceStore", "VoiceStoreError"]


class VoiceStoreError(Exception):
    """The store cannot be read or written (its directory is missing, unmounted, full)."""


class VoiceExists(Exception):
    """A voice of that name is registered already."""


@dataclass(frozen=True)
class StoredVoice:
    name: str
    audio: bytes  # float32 LE mono at REFERENCE_RATE, normalised (b"" in a listing)
    ref_text: str | None
    seconds: float
    created_at: int

    def reference(self, *, named: bool = False) -> p.VoiceReference:
        return p.VoiceReference(self.audio, REFERENCE_RATE, self.ref_text,
                                self.name if named else None)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.name, "object": "voice", "name": self.name, "ref_text": self.ref_text,
                "duration_seconds": round(self.seconds, 3), "created_at": self.created_at}

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "ref_text": self.ref_text, "seconds": self.seconds,
                "created_at": self.created_at}


class VoiceStore:
    """Voices in `root` (see the module docstring). Without a root: a temporary directory
    of this process, removed when the store is collected or the process exits."""

    def __init__(self, root: Path | None = None) -> None:
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        self._root = Path(root) if root is not None else None
        self.shared = root is not None  # other servers may change it

    @property
    def root(self) -> Path:
        """The directory; the temporary default is made on first write, so a server that
        stores no voice (or is killed) leaves nothing in TMPDIR."""
        if self._root is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="voxline-voices-")
            self._root = Path(self._temporary.name)
        return self._root

    @property
    def empty_default(self) -> bool:
        """The temporary default, not made yet: it holds no voice."""
        return self._root is None

    def _meta_path(self, name: str) -> Path:
        return self.root / f"{name.lower()}.json"

    def _fail(self, doing: str, exc: OSError) -> VoiceStoreError:
        return VoiceStoreError(f"voice store {self.root} cannot {doing}: {exc.strerror or exc}")

    def exists(self, name: str) -> bool:
        if self.empty_default:
            return False
        if not self.root.is_dir():
            raise VoiceStoreError(f"voice store {self.root} is not a reachable directory")
        return self._meta_path(name).exists()

    def get(self, name: str) -> StoredVoice | None:
        if self.empty_default:
            return None
        try:
            meta = json.loads(self._meta_path(name).read_bytes())
            audio = (self.root / meta["clip"]).read_bytes()
        except FileNotFoundError:
            if not self.root.is_dir():
                raise VoiceStoreError(f"voice store {self.root} is not a reachable "
                                      "directory") from None
            return None  # not registered (or removed while we read)
        except OSError as exc:
            raise self._fail(f"read voice {name!r}", exc) from exc
        return _voice(meta, audio)

    def all(self) -> list[StoredVoice]:
        """Every voice's metadata (audio left empty), oldest first."""
        if self.empty_default:
            return []
        try:
            found = [_voice(json.loads(path.read_bytes()), b"")
                     for path in self.root.glob("*.json")]
        except FileNotFoundError:  # removed while listed: list again
            return self.all()
        except OSError as exc:
            raise self._fail("list voices", exc) from exc
        if not found and not self.root.is_dir():
            raise VoiceStoreError(f"voice store {self.root} is not a reachable directory")
        return sorted(found, key=lambda v: (v.created_at, v.name))

    def put(self, voice: StoredVoice) -> None:
        """Add `voice`; VoiceExists if its name is taken (also by a concurrent put)."""
        meta_path = self._meta_path(voice.name)
        if meta_path.exists():
            raise VoiceExists(voice.name)
        clip = self.root / f"clip-{uuid.uuid4().hex}.f32"
        try:
            os.replace(self._write_temp(voice.audio), clip)
            meta = self._write_temp(json.dumps({**voice.metadata(), "clip": clip.name}).encode())
            try:
                os.link(meta, meta_path)  # fails if the name was taken meanwhile
            except FileExistsError:
                clip.unlink(missing_ok=True)
                raise VoiceExists(voice.name) from None
            finally:
                meta.unlink(missing_ok=True)
        except OSError as exc:
            raise self._fail(f"write voice {voice.name!r}", exc) from exc

    def remove(self, name: str) -> bool:
        """Remove a voice; False if there was none."""
        if self.empty_default:
            return False
        meta_path = self._meta_path(name)
        try:
            clip = json.loads(meta_path.read_bytes())["clip"]
            meta_path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._fail(f"remove voice {name!r}", exc) from exc
        (self.root / clip).unlink(missing_ok=True)
        return True

    def _write_temp(self, data: bytes) -> Path:
        path = self.root / f".tmp-{uuid.uuid4().hex}"
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before it is linked into place
        return path


def _voice(meta: dict[str, Any], audio: bytes) -> StoredVoice:
    return StoredVoice(str(meta["name"]), audio, meta.get("ref_text"), float(meta["seconds"]),
                       int(meta["created_at"]))
