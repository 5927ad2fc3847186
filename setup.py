"""The one compiled module, `specproxy.proxy._sse` (the SSE scanner's C core); every other setting
lives in pyproject.toml.

The extension is optional: without a C compiler the install goes on and `specproxy.proxy.sse`
uses its pure-Python scanner. `SPECPROXY_REQUIRE_EXTENSIONS=1` makes a failed build an error
(`make test` sets it, so CI never measures or tests the fallback by accident).
"""

import os

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "specproxy.proxy._sse",
            ["src/specproxy/proxy/_sse.c"],
            optional=os.environ.get("SPECPROXY_REQUIRE_EXTENSIONS") != "1",
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]
)
