"""An emulated vLLM 0.32 server with a physical timing model, for tests, the demo and predictions.

async with run_emulator(EmulatorConfig(speculative=True)) as url:
    ...  # url is "http://127.0.0.1:PORT", an OpenAI-compatible vLLM look-alike
"""

from specproxy.emulator.config import LIVE_KNOBS, EmulatorConfig
from specproxy.emulator.model import Physics, leviathan_speedup, simulate
from specproxy.emulator.server import (
    EMULATOR_KEY,
    EmulatedEngine,
    create_emulator_app,
    run_emulator,
)

__all__ = [
    "EMULATOR_KEY",
    "LIVE_KNOBS",
    "EmulatedEngine",
    "EmulatorConfig",
    "Physics",
    "create_emulator_app",
    "leviathan_speedup",
    "run_emulator",
    "simulate",
]
