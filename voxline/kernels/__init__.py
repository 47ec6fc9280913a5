"""GPU fast paths, each with an exact eager fallback used on CPU."""
