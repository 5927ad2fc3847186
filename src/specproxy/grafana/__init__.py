"""Grafana dashboards for specproxy: generated from the metric-name constants, exported or pushed.

`dashboard` builds the JSON model (pure), `push` uploads it with grafana-client, and `cli` is the
`specproxy dashboards` command.
"""
