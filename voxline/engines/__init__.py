"""The async-chunk engine: streams, stages, scheduler, engine process and its clients."""
