# syntax=docker/dockerfile:1
# specproxy container image: `docker build -t specproxy:0.1.0 .`
#
# Stage 1 builds specproxy's wheel and the wheels of every runtime dependency (plus the
# PostgreSQL driver) into /wheels. Stage 2 installs only those wheels, offline, into a slim
# Python: no compiler, no build tools, no dev extra, no pip cache. The proxy runs as the fixed
# non-root UID/GID 10001 (Kubernetes' runAsNonRoot can check a numeric USER), reads
# /etc/specproxy/specproxy.toml (host 0.0.0.0 inside the container) and takes the arms' URLs and
# any other setting from SPECPROXY_* variables or flags, e.g.
#   docker run -p 8000:8000 -e SPECPROXY_BASELINE_URL=http://vllm-base:8000 \
#     -e SPECPROXY_SPECULATIVE_URL=http://vllm-spec:8000 specproxy:0.1.0
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# A C compiler for specproxy's two compiled modules (the SSE scanner, src/specproxy/proxy/_sse.c,
# and the response-head splitter, src/specproxy/proxy/transports/_wire.c); it stays in this
# stage. SPECPROXY_REQUIRE_EXTENSIONS=1: a failed compile fails the build instead of shipping
# the slower pure-Python references.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 SPECPROXY_REQUIRE_EXTENSIONS=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential=12.9 \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# Wheels for specproxy and its runtime dependencies only (the postgres extra: asyncpg).
RUN pip wheel --wheel-dir /wheels ".[postgres]"

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
# PLACEHOLDER: the project's public home (specproxy.deploy.manifests.PROJECT_URL); a fork builds
# with --build-arg SOURCE_URL=https://github.com/<you>/specproxy
ARG SOURCE_URL=https://github.com/specproxy/specproxy
LABEL org.opencontainers.image.title="specproxy" \
      org.opencontainers.image.description="A/B proxy that proves (or disproves) speculative-decoding speedups on live vLLM traffic" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.documentation="${SOURCE_URL}#deploy"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN groupadd --system --gid 10001 specproxy \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/specproxy \
       --shell /usr/sbin/nologin specproxy \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/specproxy
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "specproxy[postgres]==${VERSION}" \
    && rm -rf /root/.cache
COPY deploy/docker/specproxy.toml /etc/specproxy/specproxy.toml
USER 10001:10001
WORKDIR /var/lib/specproxy
VOLUME ["/var/lib/specproxy"]
EXPOSE 8000
# aiohttp drains in-flight requests on SIGTERM (up to 60 s) and the store flushes its buffer.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["specproxy", "serve"]
CMD ["--config", "/etc/specproxy/specproxy.toml"]
