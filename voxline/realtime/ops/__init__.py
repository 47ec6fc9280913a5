"""Operations: `/health`, `/metrics`, `/v1/models`, the metrics registry and ids that name their server."""
