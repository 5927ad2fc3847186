"""Persistence of request records, engine samples, rollups and stats history.

`contract` is the store's contract, split by consumer (`Sink`, `SummaryReader`, `History`,
`Export`); `buffered.BufferedStore` the sink half every backend shares (batching, flushing,
spilling); `memory`, `sqlite` and `postgres` the backends; `aggregates` the additive tables,
declared once; `migrations` the frozen schema history; `registry` which backend serves which URL
scheme and `factory.open_store` the way in; `collector` the health metrics, `context` the app's
cleanup_ctx and `cli` the `specproxy export` command. Pure Python: no numpy anywhere in it.
Nothing is imported here, so `config` can read `registry` without loading a backend.
"""
