"""voxline: a streaming real-time voice engine."""

__version__ = "0.1.0"
