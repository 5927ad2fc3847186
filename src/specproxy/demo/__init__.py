"""`specproxy demo`: emulated (or real) arms, the proxy, load, a live view, then the report.

`runner` runs it (`run_demo(DemoOptions(...))`), `view` draws the live terminal view (pure), and
`cli` is the `specproxy demo` command.
"""
