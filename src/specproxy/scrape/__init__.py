"""Engine scraper: each arm's vLLM /metrics, reduced to version-independent engine samples.

`parse` reads one scrape (both engine generations), `derive` turns two scrapes into an
`EngineSample`, `loop` runs the periodic scrape on the proxy's sessions, `collector` exports the
result on the proxy's registry, `context` plugs the loop into the app's cleanup_ctx, and `warmup`
tells the stats job which requests follow a restart.
"""

from specproxy.scrape.collector import EngineCollector, register_engine_collector
from specproxy.scrape.context import SCRAPER, scrape_ctx
from specproxy.scrape.derive import derive_sample, is_restart, restart_time
from specproxy.scrape.loop import ArmState, EngineScraper
from specproxy.scrape.parse import EngineSnapshot, SpecFormat, parse_metrics
from specproxy.scrape.warmup import restart_times_from_samples, warmup_mask

__all__ = [
    "SCRAPER",
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
    "restart_times_from_samples",
    "scrape_ctx",
    "warmup_mask",
]
