"""Engine scraper: each arm's vLLM /metrics, reduced to version-independent engine samples.

`parse` reads one scrape (both engine generations), `derive` turns two scrapes into an
`EngineSample`, `loop` runs the periodic scrape on the proxy's sessions, `collector` exports the
result on the proxy's registry, and `context` plugs the loop into the app's cleanup_ctx. Which
requests a restart's warm-up window excludes is the stats job's rule (`stats.warmup`).
"""

from specproxy.scrape.collector import EngineCollector, register_engine_collector
from specproxy.scrape.context import scrape_ctx
from specproxy.scrape.derive import derive_sample, is_restart, restart_time
from specproxy.scrape.loop import ArmState, EngineScraper
from specproxy.scrape.parse import EngineSnapshot, SpecFormat, parse_metrics

__all__ = [
    "ArmState",
    "EngineCollector",
    "EngineScraper",
    "EngineSnapshot",
    "SpecFormat",
    "derive_sample",
    "is_restart",
    "parse_metrics",
    "register_engine_collector",
    "restart_time",
    "scrape_ctx",
]
