"""Persistence of request records, engine samples and stats history.

`base.Store` is the contract (and says how to extend it), `buffered.BufferedStore` the batching,
flushing and spilling every backend shares, `memory`, `sqlite` and `postgres` the backends,
`registry` which backend serves which URL scheme, `factory.open_store` the way in, `collector`
the health metrics, `context` the app's cleanup_ctx and `cli` the `specproxy export` command.
Nothing is imported here, so `config` can read `registry` without loading a backend.
"""
