"""Ids a session hands out (items, responses, events, sessions): the one home for them."""

from __future__ import annotations

import os


def new_id(prefix: str) -> str:
    """``prefix_`` + 22 hex digits of 88 random bits; unique without coordination."""
    return f"{prefix}_{os.urandom(11).hex()}"
