"""Fleets: an arm as a pool of engine endpoints, and specproxy as several replicas.

`pool` balances requests over an arm's endpoints and ejects failing ones, `discovery` keeps an
arm's endpoint list in step with DNS, `aggregate` turns per-endpoint scrapes into one arm,
`models` bounds the `model` label.
"""
