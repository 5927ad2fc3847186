"""Calibration advice from a sweep of bench blocks: which (k, temperature) to run, if any (pure).

A sweep is bench blocks (`bench --json`, one per temperature and load level) from one or more
runs; each run measures one speculative configuration, whose k (num_speculative_tokens) the
block carries (`--k`, or read from the speculative engine's per-position counters). The measure
is the block's E2E median speedup, baseline / speculative, with the bootstrap CI the harness
already computed (`bench.summary.speedups`, the stats job's own code); nothing is re-estimated
here. Load is not a setting one calibrates (traffic brings it), so each load level of a sweep
gets its own advice.

Rules, per load level:

- a block whose E2E median has too few samples for a CI is listed as insufficient, not ranked;
- the best setting is the one with the highest measured speedup (ties: the higher CI lower
  bound, then the smaller k, then the lower temperature);
- "enable" when the best setting's CI lies above 1; "do not enable" when every ranked setting's
  CI lies below 1 (no setting is faster); otherwise "inconclusive" (no setting is shown faster,
  and not all are shown slower: measure longer);
- the best is "distinguishable" from the runner-up only when their CIs do not overlap; every
  other setting whose CI overlaps the best's is named as a tie, since the data cannot tell them
  apart (overlapping 95% CIs are a conservative rule: disjoint ones imply a difference);
- settings of different k come from separate runs (one speculative configuration per run), so
  the advice says that drift between runs is outside the CIs;
- when the sweep varies both k and temperature, the same rules also run at each temperature
  alone (`by_temperature`): traffic brings its temperature, so the k to run is the best at it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "Advice",
    "Candidate",
    "Decision",
    "Insufficient",
    "advise",
    "advise_sweep",
    "load_label",
]

Decision = Literal["enable", "do_not_enable", "inconclusive", "no_data"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One measured setting: its E2E median speedup (baseline / speculative) and 95% CI."""

    run_id: str
    temperature: float
    k: int | None
    estimate: float
    lower: float
    upper: float

    @property
    def label(self) -> str:
        k = "?" if self.k is None else str(self.k)
        return f"k={k}, T={self.temperature:g}"

    def text(self) -> str:
        return f"{self.label}: {self.estimate:.2f}x [{self.lower:.2f}, {self.upper:.2f}]"

    def overlaps(self, other: Candidate) -> bool:
        return self.lower <= other.upper and other.lower <= self.upper

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "temperature": self.temperature,
            "k": self.k,
            "estimate": self.estimate,
            "lower": self.lower,
            "upper": self.upper,
        }


@dataclass(frozen=True, slots=True)
class Insufficient:
    """A setting whose E2E median CI lacks samples: how many more each arm needs."""

    run_id: str
    temperature: float
    k: int | None
    n_needed: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "temperature": self.temperature,
            "k": self.k,
            "n_needed": dict(self.n_needed),
        }


@dataclass(frozen=True, slots=True)
class Advice:
    """The advice for one load level (None: the sweep had one unnamed level)."""

    load: str | None
    decision: Decision
    message: str
    best: Candidate | None = None
    runner_up: Candidate | None = None
    distinguishable: bool | None = None  # best vs runner-up; None without a runner-up
    ties: list[Candidate] = field(default_factory=list)  # CIs overlapping the best's
    ranked: list[Candidate] = field(default_factory=list)  # best first
    insufficient: list[Insufficient] = field(default_factory=list)
    # the same rules at each temperature alone, when the sweep varies k and temperature
    by_temperature: list[Advice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "load": self.load,
            "decision": self.decision,
            "message": self.message,
            "best": self.best.to_dict() if self.best else None,
            "runner_up": self.runner_up.to_dict() if self.runner_up else None,
            "distinguishable": self.distinguishable,
            "ties": [c.to_dict() for c in self.ties],
            "ranked": [c.to_dict() for c in self.ranked],
            "insufficient": [i.to_dict() for i in self.insufficient],
            "by_temperature": [a.to_dict() for a in self.by_temperature],
        }


def load_label(block: Mapping[str, Any]) -> str | None:
    """A block's load level in words: open-loop rate, closed-loop clients, or None."""
    rate, clients = block.get("rate"), block.get("concurrency")
    if rate is not None:
        return f"{float(rate):g} req/s"
    if clients is not None:
        return f"{int(clients)} clients"
    return None


def _rank_key(c: Candidate) -> tuple[float, float, int, float]:
    return (-c.estimate, -c.lower, c.k if c.k is not None else 1 << 30, c.temperature)


def advise(
    candidates: Iterable[Candidate],
    insufficient: Sequence[Insufficient] = (),
    *,
    load: str | None = None,
) -> Advice:
    """The advice over one load level's settings (rules in the module docstring)."""
    ranked = sorted(candidates, key=_rank_key)
    lacking = list(insufficient)
    if not ranked:
        message = "no advice: no setting has both arms measured with enough samples"
        if lacking:
            need = max(max(i.n_needed.values(), default=0) for i in lacking)
            message += f" (up to {need} more requests per arm needed)"
        return Advice(load, "no_data", message, insufficient=lacking)
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    ties = [c for c in ranked[1:] if c.overlaps(best)]
    distinguishable = None if runner is None else not runner.overlaps(best)
    decision: Decision
    if best.lower > 1.0:
        decision = "enable"
        message = f"enable speculation with {best.text()} (E2E median speedup, 95% CI)"
    elif all(c.upper < 1.0 for c in ranked):
        decision = "do_not_enable"
        what = "no setting" if len(ranked) > 1 else "this setting is not"
        message = (
            f"do not enable speculation: {what} faster, every E2E median speedup CI lies below "
            f"1; best measured {best.text()}"
        )
    else:
        decision = "inconclusive"
        where = "includes 1" if best.upper >= 1.0 else "lies below 1, but not every one does"
        message = (
            f"inconclusive: no setting is shown faster; best measured {best.text()} "
            f"(E2E median speedup, 95% CI; its CI {where}): measure longer"
        )
    if runner is not None and ties:
        message += "; not distinguishable from " + ", ".join(c.text() for c in ties)
        message += " (the CIs overlap)"
    elif runner is not None:
        message += f"; clearly ahead of the runner-up {runner.text()} (the CIs do not overlap)"
    if len({c.k for c in ranked}) > 1:
        message += (
            ". Each k was measured in its own run: load that drifted between runs is not in "
            "these CIs, so confirm a close call by repeating the runs in another order"
        )
    return Advice(
        load,
        decision,
        message,
        best=best,
        runner_up=runner,
        distinguishable=distinguishable,
        ties=ties,
        ranked=ranked,
        insufficient=lacking,
    )


def advise_sweep(blocks: Iterable[Mapping[str, Any]]) -> list[Advice]:
    """One advice per load level, in first-seen order, from `bench --json` block objects."""
    groups: dict[str | None, tuple[list[Candidate], list[Insufficient]]] = {}
    for block in blocks:
        ci = (block.get("speedups") or {}).get("e2e", {}).get("median")
        if ci is None:  # one arm only: nothing compared
            continue
        raw_k = block.get("k")
        k = int(raw_k) if raw_k is not None else None
        run_id, temperature = str(block["run_id"]), float(block["temperature"])
        found, lacking = groups.setdefault(load_label(block), ([], []))
        bounds = (ci.get("estimate"), ci.get("lower"), ci.get("upper"))
        if ci.get("status") == "ok" and all(v is not None for v in bounds):
            estimate, lower, upper = (float(v) for v in bounds)
            found.append(Candidate(run_id, temperature, k, estimate, lower, upper))
        else:
            needed = {str(a): int(n) for a, n in (ci.get("n_needed") or {}).items()}
            lacking.append(Insufficient(run_id, temperature, k, needed))
    if not groups:
        return [advise([])]
    out = []
    for load, (found, lacking) in groups.items():
        overall = advise(found, lacking, load=load)
        out.append(replace(overall, by_temperature=_per_temperature(found, lacking, load)))
    return out


def _per_temperature(
    found: Sequence[Candidate], lacking: Sequence[Insufficient], load: str | None
) -> list[Advice]:
    """The best k at each temperature, when the sweep varies both (traffic brings its
    temperature; k is the knob): empty otherwise, where the overall advice says it all."""
    temperatures = sorted({c.temperature for c in found} | {i.temperature for i in lacking})
    ks = {c.k for c in found} | {i.k for i in lacking}
    if len(temperatures) < 2 or len(ks) < 2:
        return []
    return [
        advise(
            [c for c in found if c.temperature == t],
            [i for i in lacking if i.temperature == t],
            load=load,
        )
        for t in temperatures
    ]
