"""The compiled modules: `specproxy.proxy._sse` (the SSE scanner's C core),
`specproxy.proxy._usage` (reading usage out of a body) and `specproxy.proxy.transports._wire`
(the lean transport's response-head splitter), each the twin of a pure-Python reference
(`specproxy.native`); every other setting lives in pyproject.toml.

The extensions are optional: without a C compiler the install goes on and the proxy runs the
references.
`SPECPROXY_REQUIRE_EXTENSIONS=1` makes a failed build an error (`make test` sets it, so CI never
measures or tests the fallback by accident).
"""

import os

from setuptools import Extension, setup

_OPTIONAL = os.environ.get("SPECPROXY_REQUIRE_EXTENSIONS") != "1"

setup(
    ext_modules=[
        Extension(
            name,
            [source],
            optional=_OPTIONAL,
            extra_compile_args=["-O2", "-std=c11"],
        )
        for name, source in (
            ("specproxy.proxy._sse", "src/specproxy/proxy/_sse.c"),
            ("specproxy.proxy._usage", "src/specproxy/proxy/_usage.c"),
            ("specproxy.proxy.transports._wire", "src/specproxy/proxy/transports/_wire.c"),
        )
    ]
)
