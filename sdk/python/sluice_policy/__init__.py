"""Write sluice scheduling policies in Python.

A policy is a class with ``__init__(self, config)``, ``decide(self, view)`` and,
optionally, ``observe(self, outcome)`` and ``status(self)``; ``export(MyPolicy)``
turns it into what ``componentize-py`` exports for the ``sluice:policy`` world
(``wit/policy.wit``)::

    from sluice_policy import Decision, Policy, export, fastest_model

    class Fastest(Policy):
        def __init__(self, config):
            self.config = config

        def decide(self, view):
            model = fastest_model(self.config.models, view.loaded)
            if model is None or not view.queue:
                return Decision.idle()
            return Decision.serve_head(model.id, min(len(view.queue), max_batch(model)))

    WitWorld = export(Fastest)

Start here:

1. :class:`Policy`: the base class (``OBSERVES``, ``observe``, ``status``).
2. :class:`Config`: what ``__init__`` receives, with ``params`` already parsed.
3. :class:`Decision`: the answers (``serve``, ``serve_head``, ``drop_only``,
   ``wait_until``, ``idle``).
4. The helpers: :func:`latency`, :func:`max_batch`, :func:`is_loaded`,
   :func:`loaded_models`, :func:`fastest_model`, :func:`most_accurate`,
   :func:`slack`, :func:`largest_batch_within`.
5. :func:`log`, :func:`shared_get`, :func:`shared_put`: the host's imports.
6. :mod:`sluice_policy.testing`: drive a policy with ``pytest``, without Wasm.

A view's ``queue`` entries and a config's ``models`` are the contract's own records
(``wit_world.imports.types``): reading them costs nothing beyond what the
component model already paid, which matters in ``decide`` (it runs at every
decision point, budgeted in milliseconds).

Policies are pure functions of what they are given: the host grants no file,
network, environment or clock (``time`` reads zero), and randomness is seeded
with a constant; seed your own through ``params``.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterable, List, Optional, Type

from wit_world.imports import types as wit
from componentize_py_types import Err

__all__ = [
    "HOST_PARAMS_KEY",
    "Config",
    "Decision",
    "Level",
    "Policy",
    "export",
    "fastest_model",
    "is_loaded",
    "largest_batch_within",
    "latency",
    "loaded_models",
    "log",
    "max_batch",
    "most_accurate",
    "shared_get",
    "shared_put",
    "slack",
]

#: The key of ``params`` under which the host passes its own app settings
#: (``{"sluice": {"max_batch_wait_us": 5000}}``); removed from ``Config.params``
#: and kept in ``Config.host_settings``.
HOST_PARAMS_KEY = "sluice"

# Records of the contract, re-exported for type hints and tests.
Model = wit.Model
Pending = wit.Pending
View = wit.View
Outcome = wit.Outcome
Dispatch = wit.Dispatch


class Level:
    """Log levels of the host's ``log`` import."""

    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3
    TRACE = 4


class _Host:
    """The host's imports; :mod:`sluice_policy.testing` swaps in fakes."""

    @staticmethod
    def log(level: int, message: str) -> None:
        import wit_world

        wit_world.log(level, message)

    @staticmethod
    def shared_get(key: str) -> Optional[bytes]:
        import wit_world

        return wit_world.shared_get(key)

    @staticmethod
    def shared_put(key: str, value: bytes) -> bool:
        import wit_world

        return wit_world.shared_put(key, value)


_host: Any = _Host


def log(level: int, message: str) -> None:
    """Writes a line to the host's log (tagged with app, worker and policy;
    rate-limited by the host). ``print`` works too: stdout is logged at info,
    stderr at warn."""
    _host.log(level, message)


def shared_get(key: str) -> Optional[bytes]:
    """The value under ``key`` in the store every worker's instance of this
    binding shares, or ``None`` (``shared-get`` in ``wit/policy.wit``)."""
    return _host.shared_get(key)


def shared_put(key: str, value: bytes) -> bool:
    """Stores ``value`` under ``key`` unless the key is taken; whether this call
    stored it. Values must depend only on their key (``shared-put``)."""
    return _host.shared_put(key, value)


class Config:
    """What a policy learns once, when it is bound to a worker.

    ``params`` is the parsed JSON object of the policy's parameters (``{}`` when
    none were given) without the host's key; ``host_settings`` is what the host
    passed under it.
    """

    __slots__ = ("app", "slo", "workers", "worker", "models", "params", "host_settings", "params_text")

    def __init__(self, record: wit.Config):
        self.app: str = record.app
        self.slo: int = record.slo
        self.workers: int = record.workers
        self.worker: int = record.worker
        self.models: List[wit.Model] = list(record.models)
        self.params_text: str = record.params
        text = record.params.strip() or "{}"
        try:
            params = json.loads(text)
        except ValueError as e:
            raise ValueError(f"invalid params {text[:200]}: {e}") from None
        if not isinstance(params, dict):
            raise ValueError(f"invalid params {text[:200]}: not a JSON object")
        self.host_settings: dict = params.pop(HOST_PARAMS_KEY, None) or {}
        self.params: dict = params

    def model(self, id: int) -> Optional[wit.Model]:
        """The model with this id, if there is one."""
        return self.models[id] if 0 <= id < len(self.models) else None

    def model_named(self, name: str) -> Optional[wit.Model]:
        """The model with this name, if there is one."""
        return next((m for m in self.models if m.name == name), None)

    def model_names(self) -> str:
        """The model names, comma-separated, for error messages."""
        return ", ".join(m.name for m in self.models)

    def check_params(self, policy: str, known: Iterable[str]) -> None:
        """Raises ``ValueError`` naming the first parameter not in ``known`` (as
        the Rust SDK's ``deny_unknown_fields`` does)."""
        known = set(known)
        for key in self.params:
            if key not in known:
                raise ValueError(f"{policy}: unknown param `{key}` (expected one of {', '.join(sorted(known))})")


class Decision:
    """Constructors of the contract's ``decision`` variant."""

    @staticmethod
    def serve(model: int, take: List[int], drop: Optional[List[int]] = None) -> wit.Decision:
        """Serve the queue entries ``take`` (indices into ``view.queue``) with
        ``model``, dropping ``drop``."""
        return wit.Decision_Dispatch(wit.Dispatch(model, list(take), list(drop or [])))

    @staticmethod
    def serve_head(model: int, batch: int) -> wit.Decision:
        """Serve the first ``batch`` queue entries with ``model``."""
        return wit.Decision_Dispatch(wit.Dispatch(model, list(range(batch)), []))

    @staticmethod
    def drop_only(model: int, drop: List[int]) -> wit.Decision:
        """Drop ``drop`` without serving (``model`` must still be loaded)."""
        return wit.Decision_Dispatch(wit.Dispatch(model, [], list(drop)))

    @staticmethod
    def wait_until(t: int) -> wit.Decision:
        """Decide again at ``t`` (µs), or at the next arrival if sooner."""
        return wit.Decision_WaitUntil(t)

    @staticmethod
    def idle() -> wit.Decision:
        """Do nothing until the next arrival."""
        return _IDLE


_IDLE = wit.Decision_Idle()


class Policy:
    """Base class of a policy (optional: ``export`` needs only the methods).

    One instance serves one worker, so per-worker state lives in ``self``.
    """

    #: Whether ``observe`` does anything. ``False`` lets the host skip one Wasm
    #: call per batch; ``sluice policy build`` records it in the component.
    OBSERVES = True

    def __init__(self, config: Config):
        self.config = config

    def decide(self, view: wit.View) -> wit.Decision:
        """Decides what the worker does next (``Decision.…``)."""
        raise NotImplementedError

    def observe(self, outcome: wit.Outcome) -> None:
        """Learns how a dispatched batch went. The default ignores it."""

    def status(self) -> str:
        """The policy's state for operators, a JSON object."""
        return "{}"


def latency(model: wit.Model, batch: int) -> Optional[int]:
    """The profiled latency (µs) of a batch of ``batch``, or ``None`` outside the
    profile."""
    return model.latency[batch - 1] if 1 <= batch <= len(model.latency) else None


def max_batch(model: wit.Model) -> int:
    """The largest batch the model's profile covers."""
    return len(model.latency)


def is_loaded(loaded: List[int], id: int) -> bool:
    """Whether the model ``id`` is in ``loaded`` (``view.loaded``)."""
    return id in loaded


def loaded_models(models: List[wit.Model], loaded: List[int]) -> List[wit.Model]:
    """The loaded models that can serve at least a batch of one, in ``loaded``
    order; ids naming no model are skipped."""
    return [models[i] for i in loaded if 0 <= i < len(models) and models[i].latency]


def fastest_model(models: List[wit.Model], loaded: List[int]) -> Optional[wit.Model]:
    """The loaded model with the lowest batch-1 latency (ties: the lowest id)."""
    return min(loaded_models(models, loaded), key=lambda m: (m.latency[0], m.id), default=None)


def most_accurate(models: List[wit.Model], loaded: List[int]) -> Optional[wit.Model]:
    """The most accurate loaded model (ties: lower batch-1 latency, then lower id)."""
    return min(loaded_models(models, loaded), key=lambda m: (-m.accuracy, m.latency[0], m.id), default=None)


def slack(view: wit.View, index: int) -> int:
    """Deadline of ``view.queue[index]`` minus ``view.now`` (negative when late)."""
    return view.queue[index].deadline - view.now


def largest_batch_within(model: wit.Model, budget: int, cap: int) -> int:
    """The largest batch ``<= cap`` whose latency is at most ``budget`` µs (0 when
    none is)."""
    for b in range(min(cap, len(model.latency)), 0, -1):
        if model.latency[b - 1] <= budget:
            return b
    return 0


def export(policy: Type[Any]) -> type:
    """The class ``componentize-py`` exports for the policy world: assign it to
    ``WitWorld`` at the top of the module you build.

    ``init`` builds ``policy(Config(config))``; a ``ValueError`` (or ``Err``) it
    raises rejects the policy with its message, as the Rust SDK's ``Err`` does.
    Any other exception is a fault: the host logs its traceback.
    """
    # Refused here, when componentize-py imports the module to build it, rather
    # than as a fault at the first call on a serving worker.
    if not callable(getattr(policy, "decide", None)) or getattr(policy, "decide") is Policy.decide:
        raise TypeError(f"{getattr(policy, '__name__', policy)!r} has no decide(self, view): it does not implement "
                        "the sluice:policy world")
    # The wit_world import happens here, not at module level, so that
    # ``sluice_policy`` imports in plain pytest without the generated bindings'
    # host functions.
    import wit_world

    class WitWorld(wit_world.WitWorld):
        OBSERVES = getattr(policy, "OBSERVES", True)

        def init(self, config: wit.Config) -> None:
            global _instance
            try:
                _instance = policy(Config(config))
            except (ValueError, TypeError, KeyError) as e:
                raise Err(str(e))

        def decide(self, view: wit.View) -> wit.Decision:
            if _instance is None:
                return _IDLE
            return _instance.decide(view)

        def observe(self, outcome: wit.Outcome) -> None:
            if _instance is not None:
                _instance.observe(outcome)

        def status(self) -> str:
            if _instance is None:
                return "{}"
            fn: Callable[[], str] = getattr(_instance, "status", None) or (lambda: "{}")
            return fn()

    WitWorld.__name__ = WitWorld.__qualname__ = "WitWorld"
    return WitWorld


# The policy of this instance (one instance serves one worker).
_instance: Any = None
