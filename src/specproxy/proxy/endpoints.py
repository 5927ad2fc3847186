"""Which engine endpoint of an arm serves a call, and the one path every measured call takes.

An arm is a pool of endpoints (`fleet.pool`): `Upstreams.pick` takes the endpoint with the
fewest calls in flight (round-robin among equals, ejected endpoints skipped). Each endpoint has
its own transports (`transports.select`), made on first use from its base URL. `done` hands the
outcome back, which is what ejects an endpoint that keeps failing. Clients of endpoints that
left the pool (DNS discovery) are closed once nothing was picked from them for a while.

`send` and `end` are the call path shared by primary and shadow calls: pick an endpoint, send,
try the arm's other endpoints while the failure says nothing was sent (so a dead engine costs
the clients only the calls that were already in flight on it), note the answer's status and
failure in the call's `Trace`; then release or drop the connection and report the outcome.
Each try carries the headers of the arm it goes to (`headers.ArmHeaders`: its own headers and
API key), so a call rerouted to the control is sent with the control's.

Failing open: a primary call to a treatment arm in `fail_open` (`on_down = "control"`) is
rerouted to the control arm when the treatment is `down` (every endpoint ejected: it is not
tried at all) or when none of its endpoints in rotation could be connected to (nothing was
sent). Only never-sent failures are rerouted, so no request is ever sent twice; a timeout after
sending, an HTTP error or a broken stream reaches the client as before. Such a treatment's
ejected endpoints are never tried (no panic mode): the control serves instead. Shadows are never
rerouted. The control arm itself never fails over to a treatment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping

from specproxy.errors import ErrorKind, UpstreamError
from specproxy.fleet.arms import Fleet
from specproxy.fleet.pool import Endpoint
from specproxy.proxy.headers import ArmHeaders, OutboundHeaders
from specproxy.proxy.trace import Trace
from specproxy.proxy.transports.base import Reply, UpstreamTransport
from specproxy.proxy.transports.select import Mode, TransportFactory, Transports
from specproxy.records import Arm, RerouteReason

__all__ = ["EndpointClients", "EngineLoad", "Upstreams", "verdict"]

# (arm, endpoint URL) -> that endpoint's (running, waiting) requests at its latest scrape
EngineLoad = Callable[[Arm, str], tuple[float | None, float | None]]


def verdict(error_kind: ErrorKind | None) -> bool | None:
    """The outcome of a call for the endpoint's failure streak (None: no verdict)."""
    if error_kind is None:
        return True
    if error_kind.verdict_free:
        return None
    return not error_kind.engine_failure


class EndpointClients:
    """How the proxy calls one endpoint: a transport per `Mode`."""

    __slots__ = ("base", "transports")

    def __init__(self, base: str, transports: Transports) -> None:
        self.base = base
        self.transports = transports

    async def close(self) -> None:
        closed: list[UpstreamTransport] = []
        for transport in self.transports.values():
            if not any(t is transport for t in closed):
                closed.append(transport)
                await transport.close()


class Upstreams:
    """Every arm's endpoints with their clients, created on first use."""

    def __init__(
        self,
        fleet: Fleet,
        transports: TransportFactory,
        fail_open: Collection[Arm] = (),
        arm_headers: Mapping[Arm, ArmHeaders] | None = None,
        engine_load: EngineLoad | None = None,
    ) -> None:
        """`fail_open`: the treatment arms whose calls the control serves while they are down;
        `arm_headers`: what each arm adds to the headers it is sent (none by default).
        `engine_load`: an endpoint's running and waiting requests at its latest scrape (the
        scraper's memory, no I/O), recorded with each call sent there."""
        self._fleet = fleet
        self._arm_headers = dict(arm_headers or {})
        self._make = transports
        self._fail_open = frozenset(a for a in fail_open if a != fleet.control)
        # Per (arm, URL): an arm's transports carry its timeouts, even where arms share an engine.
        self._clients: dict[tuple[Arm, str], EndpointClients] = {}
        self._inflight: dict[tuple[Arm, str], int] = {}  # calls in flight per endpoint
        self._arm_inflight: dict[Arm, int] = dict.fromkeys(fleet.arms, 0)  # and per arm
        self._engine_load = engine_load
        self._pruning: set[asyncio.Task[None]] = set()

    def down(self, arm: Arm) -> bool:
        """Whether every endpoint of `arm` is ejected."""
        return self._fleet.pool(arm).down

    def fails_open(self, arm: Arm) -> bool:
        """Whether a primary call to `arm` goes to the control while `arm` is down."""
        return arm in self._fail_open

    def pick(self, arm: Arm) -> tuple[Endpoint, EndpointClients]:
        """The endpoint for the next call to `arm` (counted in flight until `done`)."""
        return self._clients_for(arm, self._fleet.pool(arm).acquire())

    def _clients_for(self, arm: Arm, endpoint: Endpoint) -> tuple[Endpoint, EndpointClients]:
        key = (arm, endpoint.url)
        clients = self._clients.get(key)
        if clients is None:
            clients = self._clients[key] = EndpointClients(key[1], self._make(*key))
            task = asyncio.get_running_loop().create_task(self.prune())
            self._pruning.add(task)
            task.add_done_callback(self._pruning.discard)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        self._arm_inflight[arm] += 1
        return endpoint, clients

    def pick_other(
        self, arm: Arm, tried: Collection[str], *, panic: bool = True
    ) -> tuple[Endpoint, EndpointClients] | None:
        """Another endpoint of `arm` than those `tried`, for a call that was never sent
        (`panic=False`: never an ejected one)."""
        endpoint = self._fleet.pool(arm).acquire_other(tried, panic=panic)
        return None if endpoint is None else self._clients_for(arm, endpoint)

    def _retry(
        self, trace: Trace, tried: Collection[str]
    ) -> tuple[Endpoint, EndpointClients] | None:
        """Where a call that was never sent goes next: another endpoint of its arm, else (a
        primary call to a fail-open treatment) the control arm, rerouting `trace`."""
        arm = trace.arm
        fail_open = not trace.shadow and arm in self._fail_open
        other = self.pick_other(arm, tried, panic=not fail_open)
        if other is not None or not fail_open:
            return other
        trace.reroute(RerouteReason.CONNECT, self._fleet.control)
        return self.pick(trace.arm)

    def headers_to(self, arm: Arm, headers: OutboundHeaders) -> OutboundHeaders:
        """A client's headers as `arm` is sent them: with its own headers and API key."""
        own = self._arm_headers.get(arm)
        return headers if own is None else headers.for_arm(own)

    def done(self, arm: Arm, endpoint: Endpoint, error_kind: ErrorKind | None) -> None:
        """The call ended with `error_kind` (None: success)."""
        self._inflight[(arm, endpoint.url)] -= 1
        self._arm_inflight[arm] -= 1
        self._fleet.pool(arm).release(endpoint, ok=verdict(error_kind))

    async def send(
        self,
        trace: Trace,
        mode: Mode,
        target: str,
        body: bytes | None,
        headers: OutboundHeaders,
        method: str = "POST",
    ) -> Reply:
        """Send one measured call to `trace.arm`; the reply once its headers arrived.

        A failure before the headers is noted in the trace (kind and the status the client
        gets) and raised; the endpoint the call ended on is `trace.engine` either way, for
        `end`. A primary call to a fail-open treatment that is down goes to the control
        (`trace.reroute`)."""
        if not trace.shadow and trace.arm in self._fail_open and self.down(trace.arm):
            trace.reroute(RerouteReason.DOWN, self._fleet.control)
        arm = trace.arm
        endpoint, clients = self.pick(arm)
        self._note(trace, arm, endpoint)
        tried: list[str] = []
        while True:
            try:
                sent = self.headers_to(arm, headers)
                reply = await clients.transports[mode].send(method, target, body, sent)
                break
            except UpstreamError as exc:
                tried.append(endpoint.url)
                other = self._retry(trace, tried) if exc.never_sent else None
                if other is None:
                    trace.fail(exc.kind, exc.status)
                    raise
                # Nothing was sent: the arm's next endpoint (or the control's) serves it.
                self.done(arm, endpoint, exc.kind)
                if trace.arm != arm:
                    arm, tried = trace.arm, []
                endpoint, clients = other
                self._note(trace, arm, endpoint)
        trace.status = reply.status
        kind = ErrorKind.of_status(reply.status)
        if kind is not None:
            trace.fail(kind)
        return reply

    def _note(self, trace: Trace, arm: Arm, endpoint: Endpoint) -> None:
        """The endpoint a call goes to, and the load it meets there (this call included)."""
        url = endpoint.url
        trace.engine = endpoint
        trace.engine_url = url
        trace.arm_in_flight = self._arm_inflight[arm]
        trace.endpoint_in_flight = self._inflight[(arm, url)]
        if self._engine_load is not None:
            trace.engine_running, trace.engine_waiting = self._engine_load(arm, url)

    def end(self, trace: Trace, reply: Reply | None) -> None:
        """The call is over: keep or drop its connection, report the outcome of its endpoint."""
        if reply is not None:
            if trace.error_kind is None:
                reply.release()
            else:
                reply.close()
        endpoint = trace.engine
        if endpoint is not None:
            trace.engine = None
            self.done(trace.arm, endpoint, trace.error_kind)

    @property
    def clients(self) -> int:
        """Endpoints with open clients (bounded by the pools plus those still in flight)."""
        return len(self._clients)

    async def prune(self) -> None:
        """Close the clients of endpoints that left every pool and have nothing in flight."""
        live = {(arm, url) for arm in self._fleet.arms for url in self._fleet.endpoints(arm)}
        for key in [k for k in self._clients if k not in live and not self._inflight.get(k)]:
            self._inflight.pop(key, None)
            await self._clients.pop(key).close()

    async def close(self) -> None:
        for task in list(self._pruning):
            await task
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()
