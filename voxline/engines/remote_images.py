"""Images in a remote reply model's conversation (`remote_llm.RemoteChat`).

An image is one symbol in a message's symbol sequence, placed at its offset in the text:
`ImageSymbols.symbol` gives each image a fresh number past the chat marks and remembers
the image under it weakly. The conversation's message holds the image itself
(`conversation.Item.images`), so an entry lives exactly as long as a message that can
render it, and a deleted message or closed stream leaves nothing behind.
`chat_content` turns a user message's text and image symbols back into Chat Completions
content parts, in order: `{"type": "image_url", "image_url": {"url", "detail"}}`, as
vLLM and SGLang take for vision models.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from voxline.engines.protocol import ImageInput


class ImageSymbols:
    """Image symbols from `base` up, each naming one image while a message holds it."""

    def __init__(self, base: int) -> None:
        self.base = base
        self._next = itertools.count(base)
        self._images: weakref.WeakValueDictionary[int, ImageInput] = \
            weakref.WeakValueDictionary()

    def symbol(self, image: ImageInput) -> int:
        sym = next(self._next)
        self._images[sym] = image
        return sym

    def get(self, symbol: int) -> ImageInput | None:
        return self._images.get(symbol)

    def __len__(self) -> int:
        return len(self._images)


def render_with_images(text: str, images: tuple[ImageInput, ...], symbols: ImageSymbols
                       ) -> list[int]:
    """`text` as code points with each image's symbol at its offset."""
    out: list[int] = []
    at = 0
    for image in sorted(images, key=lambda im: im.offset):
        cut = min(max(image.offset, at), len(text))
        out.extend(map(ord, text[at:cut]))
        out.append(symbols.symbol(image))
        at = cut
    out.extend(map(ord, text[at:]))
    return out


def image_part(image: ImageInput) -> dict[str, Any]:
    url: dict[str, Any] = {"url": image.url}
    if image.detail is not None:
        url["detail"] = image.detail
    return {"type": "image_url", "image_url": url}


def chat_content(pieces: list[str | ImageInput]) -> list[dict[str, Any]]:
    """Chat Completions content parts of a message's text pieces and images, in order
    (empty text pieces left out)."""
    return [image_part(p) if isinstance(p, ImageInput) else {"type": "text", "text": p}
            for p in pieces if not isinstance(p, str) or p]
