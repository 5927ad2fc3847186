"""One arm's engine endpoints: which one serves the next request, and which are ejected.

Pure state, no I/O: the proxy asks `acquire()` for an endpoint and hands the outcome back with
`release()`; discovery replaces the endpoint list with `update()`; the scraper reports probe
results with `probe()`. Every time comes from the injected clock.

Balancing is least outstanding requests (the endpoint with the fewest requests in flight from
this process), ties broken round-robin, so an idle pool still spreads its requests evenly.

Passive health is Envoy's outlier detection, consecutive-failure flavour: after
`eject_after_failures` consecutive failed requests an endpoint is ejected for
`base_ejection_s * n` (n = how many times it has been ejected, capped at `max_ejection_s`). When
that time is up it is not simply readmitted: it stays out until a probe (the scraper's next
successful /metrics scrape of it) succeeds, so a client request is never the test of whether a
dead engine came back. A success resets the failure streak. When every endpoint is ejected the
pool is `down`; by default it then routes to all of them (Envoy's panic mode): answering with
errors from the engines beats refusing every request at the proxy. That is what the control arm
does. A treatment that fails open (`on_down = "control"`) asks `down` first and sends its
requests to the control instead, and passes `panic=False` so that an ejected endpoint is never
chosen for it; the probes readmit its endpoints as they readmit any (a probe does not need an
endpoint in rotation).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from specproxy.config import OutlierConfig

logger = logging.getLogger("specproxy.fleet.pool")

__all__ = ["Endpoint", "EndpointPool"]


class Endpoint:
    """One engine endpoint of an arm and what this process knows about it."""

    __slots__ = ("ejected_until", "ejections", "failures", "outstanding", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.outstanding = 0  # requests in flight from this process
        self.failures = 0  # consecutive failed requests
        self.ejections = 0  # times ejected so far (the ejection time grows with it)
        self.ejected_until: float | None = None  # None: in rotation

    @property
    def ejected(self) -> bool:
        return self.ejected_until is not None

    def __repr__(self) -> str:
        state = "ejected" if self.ejected else "in"
        return f"Endpoint({self.url!r}, {state}, outstanding={self.outstanding})"


class EndpointPool:
    """The endpoints of one arm, balanced by least outstanding requests."""

    def __init__(
        self,
        urls: Iterable[str],
        policy: OutlierConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        """`name`: the arm's, for the log; `on_event(event, url)` hears each ejection
        ("ejected") and readmission ("readmitted")."""
        self._name = name
        self._on_event = on_event
        self._policy = policy if policy is not None else OutlierConfig()
        self._clock = clock
        self._endpoints: list[Endpoint] = []
        self._cursor = 0
        self.update(urls)

    @property
    def endpoints(self) -> Sequence[Endpoint]:
        return tuple(self._endpoints)

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(ep.url for ep in self._endpoints)

    def update(self, urls: Iterable[str]) -> None:
        """Replace the endpoint list (discovery); known endpoints keep their state.

        An endpoint that left the list keeps existing for the requests in flight on it: their
        `release` still works, it is just no longer chosen.
        """
        known = {ep.url: ep for ep in self._endpoints}
        new = list(dict.fromkeys(urls))
        if not new:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self._endpoints = [known.get(url) or Endpoint(url) for url in new]
        self._cursor %= len(self._endpoints)

    @property
    def down(self) -> bool:
        """Whether every endpoint is ejected (no endpoint in rotation)."""
        return all(ep.ejected_until is not None for ep in self._endpoints)

    def acquire(self) -> Endpoint:
        """The endpoint for the next request; counts it as outstanding until `release`."""
        best = self._choose(())
        assert best is not None  # the list is never empty and nothing is excluded
        return best

    def acquire_other(self, exclude: Collection[str], *, panic: bool = True) -> Endpoint | None:
        """Like `acquire`, but never an endpoint in `exclude` (None when none is left); with
        `panic=False` never an ejected one either.

        For a call that could not even connect: nothing was sent, so another endpoint may
        serve it.
        """
        return self._choose(exclude, panic=panic)

    def _choose(self, exclude: Collection[str], *, panic: bool = True) -> Endpoint | None:
        endpoints = self._endpoints
        n = len(endpoints)
        best: Endpoint | None = None
        start = self._cursor
        for any_state in (False, True) if panic else (False,):
            for i in range(n):
                ep = endpoints[(start + i) % n]
                if (ep.ejected_until is not None and not any_state) or ep.url in exclude:
                    continue
                if best is None or ep.outstanding < best.outstanding:
                    best = ep
            if best is not None:
                break
        if best is None:
            return None
        # Round-robin tie-break: the scan starts one further each time.
        self._cursor = (start + 1) % n
        best.outstanding += 1
        return best

    def release(self, endpoint: Endpoint, *, ok: bool | None) -> None:
        """The request on `endpoint` ended: `ok=False` for a failure of the endpoint itself.

        A failure says something about the engine: refused, timed out, broken mid-response,
        HTTP 5xx. A 4xx is the client's problem and counts as ok. `ok=None` is no verdict (the
        client went away, the proxy shut down): the streak is left as it is.
        """
        endpoint.outstanding -= 1
        if ok is None:
            return
        if ok:
            endpoint.failures = 0
            return
        endpoint.failures += 1
        limit = self._policy.eject_after_failures
        if limit > 0 and endpoint.failures >= limit and endpoint.ejected_until is None:
            self._eject(endpoint)

    def due_for_probe(self) -> tuple[Endpoint, ...]:
        """Ejected endpoints whose ejection time is over: a successful probe readmits them."""
        now = self._clock()
        return tuple(
            ep for ep in self._endpoints if ep.ejected_until is not None and ep.ejected_until <= now
        )

    def probe(self, url: str, *, ok: bool) -> None:
        """A health probe of `url` (e.g. a /metrics scrape) ended.

        Readmits the endpoint if its ejection time is over and the probe succeeded; a failed
        probe after the ejection time ejects it again, for longer. Probes of endpoints in
        rotation change nothing: passive health is judged on requests.
        """
        ep = next((e for e in self._endpoints if e.url == url), None)
        if ep is None or ep.ejected_until is None or ep.ejected_until > self._clock():
            return
        if ok:
            ep.ejected_until = None
            ep.failures = 0
            logger.info("%s endpoint %s readmitted: a probe succeeded", self._name, url)
            if self._on_event is not None:
                self._on_event("readmitted", url)
        else:
            self._eject(ep)

    def _eject(self, ep: Endpoint) -> None:
        ep.ejections += 1
        policy = self._policy
        duration = min(policy.base_ejection_s * ep.ejections, policy.max_ejection_s)
        ep.ejected_until = self._clock() + duration
        logger.warning(
            "%s endpoint %s ejected for %.0f s after %d consecutive failures (ejection %d)",
            self._name,
            ep.url,
            duration,
            ep.failures,
            ep.ejections,
        )
        if self._on_event is not None:
            self._on_event("ejected", ep.url)
