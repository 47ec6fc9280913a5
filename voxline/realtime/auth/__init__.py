"""Credentials: API keys, signed client secrets and the route that issues them."""
