"""Runtime control of the experiment: arm weights, pauses and the kill switch, shared by replicas.

`events` holds the values: an `ArmEvent` (one change, with who/why/when) and `ArmState` (what a
replica applies, folded from the events in order). Pure logic, no I/O. The store keeps the events
(`store.contract.Control`); the admin API, the CLI and the guarded ramp append them; every replica
polls them and applies the folded state to its router: `live` (one replica's state, applied to
the `proxy.routing.Router` and the gauges), `context` (the poller, a cleanup_ctx), `commands`
(the admin API's bodies and view, pure), `api` (the admin routes), `cli` (`specproxy arms`).
Nothing is imported here.
"""
