"""Unit-test a policy with plain ``pytest``, without building Wasm.

``Harness(MyPolicy, config(...))`` builds the policy as the component's ``init``
would (``Config`` from the contract's record), captures what it logs, gives it an
in-memory shared store, and checks each decision against the rules the host
enforces (:func:`check_decision`, the Python twin of the Rust SDK's
``helpers::check_decision``)::

    h = Harness(MyPolicy, config(100_000, [linear_model(0, "m", 0.7, 5_000, 1_000, 8)]))
    view = h.view(now=0, load_qps=50.0, queue=[pending(0, 0, 100_000)])
    assert h.decide(view) == Decision.serve_head(0, 1)

The pytest path needs ``sdk/python`` and ``sdk/python/bindings`` (the bindings
``componentize-py bindings`` generated for ``wit/policy.wit``, committed so that
tests run without componentize-py); ``sluice policy new --lang python`` writes a
``pyproject.toml`` that sets it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import sluice_policy
from sluice_policy import Config
from wit_world.imports import types as wit

__all__ = ["Harness", "Invalid", "check_decision", "config", "linear_model", "pending"]


def config(slo: int, models: List[wit.Model], params: str = "", workers: int = 1, worker: int = 0,
           app: str = "test") -> wit.Config:
    """The contract's ``config`` record for a test."""
    return wit.Config(app=app, slo=slo, workers=workers, worker=worker, models=models, params=params)


def linear_model(id: int, name: str, accuracy: float, first: int, step: int, max_batch: int) -> wit.Model:
    """A model whose latency is ``first + step·(b-1)`` µs for ``b`` in ``1..=max_batch``."""
    return wit.Model(id=id, name=name, accuracy=accuracy, latency=[first + step * b for b in range(max_batch)])


def pending(id: int, arrival: int, slo: int) -> wit.Pending:
    """A queued request that arrived at ``arrival`` with deadline ``arrival + slo``."""
    return wit.Pending(id=id, arrival=arrival, deadline=arrival + slo)


class Invalid(AssertionError):
    """A decision the host would refuse (and answer with its safe policy)."""


def check_decision(models: List[wit.Model], view: wit.View, decision: Any) -> None:
    """Raises :class:`Invalid` when the host would refuse ``decision``."""
    if isinstance(decision, wit.Decision_Idle):
        return
    if isinstance(decision, wit.Decision_WaitUntil):
        if decision.value <= view.now:
            raise Invalid(f"wait-until {decision.value} is not after now = {view.now}")
        return
    if not isinstance(decision, wit.Decision_Dispatch):
        raise Invalid(f"not a decision: {decision!r} (use sluice_policy.Decision)")
    d = decision.value
    if not 0 <= d.model < len(models):
        raise Invalid(f"unknown model {d.model}")
    if d.model not in view.loaded:
        raise Invalid(f"model {d.model} is not loaded")
    if not d.take and not d.drop:
        raise Invalid("a dispatch that takes and drops nothing")
    if len(d.take) > len(models[d.model].latency):
        raise Invalid(f"batch of {len(d.take)} exceeds the model's largest, {len(models[d.model].latency)}")
    seen = set()
    for i in list(d.take) + list(d.drop):
        if not 0 <= i < len(view.queue):
            raise Invalid(f"index {i} out of range (queue of {len(view.queue)})")
        if i in seen:
            raise Invalid(f"index {i} appears twice")
        seen.add(i)


class _FakeHost:
    """Stands in for the host's imports: captures logs, keeps a shared store."""

    def __init__(self) -> None:
        self.logs: List[Tuple[int, str]] = []
        self.shared: Dict[str, bytes] = {}

    def log(self, level: int, message: str) -> None:
        self.logs.append((level, message))

    def shared_get(self, key: str) -> Optional[bytes]:
        return self.shared.get(key)

    def shared_put(self, key: str, value: bytes) -> bool:
        if key in self.shared or len(key) > 1024:
            return False
        self.shared[key] = bytes(value)
        return True


class Harness:
    """One policy instance on one worker, driven by hand-made views."""

    def __init__(self, policy: type, record: wit.Config, host: Optional[_FakeHost] = None):
        self.host = host or _FakeHost()
        sluice_policy._host = self.host
        self.record = record
        self.config = Config(record)
        self.policy = policy(self.config)
        self.loaded: List[int] = [m.id for m in record.models]

    @staticmethod
    def init_error(policy: type, record: wit.Config) -> str:
        """The message with which ``init`` rejects ``record`` (fails the test when
        it is accepted)."""
        sluice_policy._host = _FakeHost()
        try:
            policy(Config(record))
        except (ValueError, TypeError, KeyError) as e:
            return str(e)
        raise AssertionError("init accepted the config")

    @property
    def logs(self) -> List[Tuple[int, str]]:
        """What the policy logged, as (level, message)."""
        return self.host.logs

    def set_loaded(self, loaded: List[int]) -> None:
        """The models views made by :meth:`view` say are loaded (default: all)."""
        self.loaded = list(loaded)

    def view(self, now: int, load_qps: float, queue: List[wit.Pending]) -> wit.View:
        """A view of this worker at ``now``."""
        return wit.View(now=now, worker=self.record.worker, workers=self.record.workers, load_qps=load_qps,
                        loaded=list(self.loaded), queue=list(queue))

    def decide(self, view: wit.View) -> Any:
        """The policy's decision, checked as the host checks it."""
        sluice_policy._host = self.host
        decision = self.policy.decide(view)
        check_decision(self.record.models, view, decision)
        return decision

    def observe(self, outcome: wit.Outcome) -> None:
        """Tells the policy how a batch went."""
        sluice_policy._host = self.host
        self.policy.observe(outcome)
