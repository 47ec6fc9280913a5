"""The package version, importable by every layer without loading the SDK."""

__version__ = "0.1.0"
