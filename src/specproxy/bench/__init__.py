"""`specproxy bench`: drive endpoints directly (or through the proxy) and record like the proxy.

`harness` runs the warm-up and the measured blocks (`run_bench`), `summary` and `warmup` are its
pure parts, and `cli` is the `specproxy bench` command.
"""
