"""Jellyfish+ in Python: the load-granular model-selection baseline of RAMSIS
(EuroSys'24 §7; Jellyfish, RTSS'22), a line-for-line port of
``policies/jellyfish`` (the Rust crate), which it must decide identically to
(``tests/python_policies.rs``, the differential test).

Each worker assumes it receives ``r = λ / K`` requests per second. For every
loaded model it finds the largest batch ``b <= max_batch`` whose throughput
``b / L(b)`` is at least ``headroom · r`` and whose latency ``L(b)`` is at most
SLO/2, and serves with the most accurate model that has one; when none has, the
fastest loaded model at the largest batch within SLO/2 (or ``max_batch`` with
``overload_batch = "max"``). Work-conserving; never drops.
"""

import math

from sluice_policy import Config, Decision, Level, Policy, export, latency, log

PARAMS = ("load_qps", "loads", "headroom", "max_batch", "overload_batch")


class Candidate:
    """A model with its batch sizes precomputed for the selection rule."""

    __slots__ = ("id", "accuracy", "fastest", "within_half_slo", "largest", "steps")

    def __init__(self, model, slo, max_batch):
        self.id = model.id
        self.accuracy = model.accuracy
        self.fastest = model.latency[0]
        cap = min(max_batch, len(model.latency))

        def fits(b):
            return model.latency[b - 1] * 2 <= slo

        self.within_half_slo = next((b for b in range(cap, 0, -1) if fits(b)), 0)
        self.largest = cap
        # (throughput, b), descending b with strictly increasing throughput: the
        # first entry with throughput >= x is the largest b that sustains x.
        self.steps = []
        for b in range(self.within_half_slo, 0, -1):
            if not fits(b):
                continue
            throughput = b * 1e6 / float(model.latency[b - 1])
            if not self.steps or throughput > self.steps[-1][0]:
                self.steps.append((throughput, b))

    def batch_for(self, needed):
        for throughput, b in self.steps:
            if throughput >= needed:
                return b
        return None


class Jellyfish(Policy):
    OBSERVES = False

    def __init__(self, config: Config):
        p = config.params
        config.check_params("jellyfish", PARAMS)
        self.load_qps = p.get("load_qps")
        self.loads = p.get("loads")
        self.headroom = p.get("headroom", 1.05)
        self.max_batch = p.get("max_batch", 32)
        self.overload_batch = p.get("overload_batch", "half-slo")
        if self.loads is not None:
            if not self.loads or any(not _number(x) or not math.isfinite(x) or x < 0 for x in self.loads):
                raise ValueError("jellyfish: param `loads` must be a non-empty list of non-negative numbers")
            self.loads = sorted(float(x) for x in self.loads)
        if not _number(self.headroom) or not (math.isfinite(self.headroom) and self.headroom > 0):
            raise ValueError(f"jellyfish: param `headroom` must be a positive number, got {self.headroom}")
        if not isinstance(self.max_batch, int) or self.max_batch <= 0:
            raise ValueError("jellyfish: param `max_batch` must be at least 1")
        if self.load_qps is not None and not (_number(self.load_qps) and math.isfinite(self.load_qps) and self.load_qps >= 0):
            raise ValueError(f"jellyfish: param `load_qps` must be a non-negative number, got {self.load_qps}")
        if self.overload_batch not in ("half-slo", "max"):
            raise ValueError(f"jellyfish: param `overload_batch`: unknown variant `{self.overload_batch}`")
        self.by_accuracy = [Candidate(m, config.slo, self.max_batch) for m in config.models if m.latency]
        if not self.by_accuracy:
            raise ValueError("jellyfish: no model has a latency profile")
        self.by_accuracy.sort(key=lambda c: (-c.accuracy, c.id))
        # (lambda, workers, loaded) -> choice: the inputs change far less often
        # than decide is called.
        self.key = None
        self.choice = None

    def choose(self, lam, workers, loaded):
        """(model, batch, sustains_load) for load ``lam`` over ``workers``, or None."""
        needed = self.headroom * (lam / max(workers, 1))
        candidates = [c for c in self.by_accuracy if c.id in loaded]
        for c in candidates:
            b = c.batch_for(needed)
            if b is not None:
                return (c.id, b, True)
        if not candidates:
            return None
        c = min(candidates, key=lambda c: (c.fastest, c.id))
        batch = max(c.within_half_slo, 1) if self.overload_batch == "half-slo" else max(c.largest, 1)
        return (c.id, batch, False)

    def lam(self, view):
        lam = self.load_qps if self.load_qps is not None else view.load_qps
        lam = lam if lam >= 0.0 else 0.0  # NaN or negative: no usable load
        if self.loads is not None:
            return next((l for l in self.loads if l >= lam), self.loads[-1])
        return float(lam)

    def decide(self, view):
        lam = self.lam(view)
        key = (lam, view.workers, tuple(view.loaded))
        if key != self.key:
            choice = self.choose(lam, view.workers, view.loaded)
            if choice != self.choice or self.key is None:
                if choice is None:
                    log(Level.WARN, "jellyfish: no loaded model can serve")
                else:
                    note = "" if choice[2] else " (overloaded: fastest model)"
                    log(Level.DEBUG, f"jellyfish: model {choice[0]} batch {choice[1]} at {lam:.0f} req/s over {view.workers} workers{note}")
            self.key, self.choice = key, choice
        if self.choice is None or not view.queue:
            return Decision.idle()
        return Decision.serve_head(self.choice[0], min(self.choice[1], len(view.queue)))

    def status(self):
        if self.key is None:
            return "{}"
        if self.choice is None:
            return '{"model":null,"load_qps":%.1f}' % self.key[0]
        model, batch, sustains = self.choice
        return '{"model":%d,"batch":%d,"sustains_load":%s,"load_qps":%.1f}' % (
            model, batch, "true" if sustains else "false", self.key[0])


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


WitWorld = export(Jellyfish)
