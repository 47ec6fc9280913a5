"""Image input (``input_image`` parts of user messages): validation, bounds, engine form.

A client sends an image as a data URL (``data:image/png;base64,...``, as OpenAI's GA
Realtime API documents) or as bare base64 (the type is then read from the bytes). The
session keeps the part exactly as sent; the engine gets a data URL of an accepted type
(PNG, JPEG, WebP, GIF), its ``detail`` and where it sits in the message's text, and a
remote reply model receives it as Chat Completions image content. Images are bounded in
decoded bytes each and in count per session (all images accepted over the session's life,
so deleting items frees no quota and the engine holds at most that many). A model that
reads no images (the embedded one) refuses them: ``limits`` is None.

Errors name the event and the part's field, e.g. ``item.content[1].image_url``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.sessions.items import ContentPart

EVENT = "conversation.item.create"
# mime type -> the magic bytes its files start with (WebP: RIFF....WEBP, checked apart)
IMAGE_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)((?:;[\w.+-]+=[^;,]*)*);base64,(.*)$", re.S)


@dataclass(frozen=True)
class ImageLimits:
    """Bounds on a session's images: decoded bytes per image, images per session."""

    max_bytes: int
    max_count: int


def sniff_mime(data: bytes) -> str | None:
    """The accepted image type `data` is, by its magic bytes, or None."""
    for mime, magics in IMAGE_MAGIC.items():
        if data.startswith(magics):
            if mime == "image/webp" and data[8:12] != b"WEBP":
                continue
            return mime
    return None


def _error(param: str, what: str) -> ProtocolError:
    return ProtocolError(f"{EVENT}: {what}", code="invalid_value", param=param)


def _decode(b64: str, param: str, max_bytes: int) -> bytes:
    # a cheap bound before decoding: base64 is 4 characters per 3 bytes
    if len(b64) > (max_bytes + 2) // 3 * 4 + 4:
        raise _error(param, f"the image is larger than the limit of {max_bytes} bytes "
                     "(max_image_bytes)")
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _error(param, f"the image is not valid base64 ({exc})") from None
    if len(data) > max_bytes:
        raise _error(param, f"the image is {len(data)} bytes, larger than the limit of "
                     f"{max_bytes} bytes (max_image_bytes)")
    if not data:
        raise _error(param, "the image is empty")
    return data


def image_data_url(image_url: str, param: str, max_bytes: int) -> str:
    """The data URL of a validated image, from a data URL or bare base64 as sent."""
    match = _DATA_URL.match(image_url)
    if match is None and image_url.startswith(("http://", "https://")):
        raise _error(param, "image URLs are not fetched; send the image as a data URL "
                     "(data:image/png;base64,...)")
    if match is None and image_url.startswith("data:"):
        raise _error(param, "a data URL must read data:<image type>;base64,<data>")
    mime, b64 = (match.group(1).lower(), match.group(3)) if match else (None, image_url)
    if mime is not None and mime not in IMAGE_MAGIC:
        raise _error(param, f"image type {mime!r} is not supported; use one of "
                     f"{', '.join(IMAGE_MAGIC)}")
    data = _decode(b64.strip(), param, max_bytes)
    found = sniff_mime(data)
    if found is None:
        raise _error(param, "the data is not a PNG, JPEG, WebP or GIF image")
    if mime is not None and found != mime:
        raise _error(param, f"the data URL says {mime} but the data is {found}")
    return image_url if mime is not None else f"data:{found};base64,{b64.strip()}"


def engine_images(content: list[ContentPart], limits: ImageLimits | None,
                  accepted: int) -> tuple[ep.ImageInput, ...]:
    """The engine's images of a user message (validated; `accepted` images this session
    had before), or ProtocolError naming the first part that cannot be taken."""
    out: list[ep.ImageInput] = []
    offset = 0
    for i, part in enumerate(content):
        if part.type != "input_image":
            offset += len(part.text or part.transcript or "")
            continue
        if limits is None:
            raise ProtocolError(f"{EVENT}: image input (item.content[{i}]) is not supported by "
                                "the embedded text-only model (start the server with "
                                "--llm openai:<url> for a vision model)", code="invalid_value",
                                param=f"item.content[{i}]")
        if accepted + len(out) >= limits.max_count:
            raise _error(f"item.content[{i}]", f"a session takes at most {limits.max_count} "
                         "images (max_session_images)")
        assert part.image_url is not None  # ContentPart validates it
        url = image_data_url(part.image_url, f"item.content[{i}].image_url", limits.max_bytes)
        out.append(ep.ImageInput(url, part.detail, offset))
    return tuple(out)
