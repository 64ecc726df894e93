"""spread-drop in Python: batching with a bound on consecutive drops (MCD), on
weakly-hard (m, K) drops, or early drop; a line-for-line port of
``policies/spread-drop`` (the Rust crate; see its README for the paper), which it
must decide identically to (``tests/python_policies.rs``).

At each decision point the requests that can no longer make their deadline are
dropped; the timer fires when the head's deadline minus the batch's processing
time (and a margin) arrives; the batch is then chosen among the requests due
within two processing times so that the drops are spread out per the objective.
"""

from sluice_policy import Config, Decision, Level, Policy, export, fastest_model, latency, loaded_models, log

PARAMS = ("model", "batch", "latency_us", "processing_us", "weakly_hard", "early_drop", "margin_us")
DEFAULT_MARGIN_US = 5_000

EARLY_DROP = ("early-drop",)
MCD = ("mcd",)


def select(candidates, batch, objective, history):
    """Indices (into the candidates) served by a batch of ``batch``."""
    if batch == 0:
        return []
    if candidates <= batch:
        return list(range(candidates))
    if objective == EARLY_DROP:
        return list(range(batch))
    if objective == MCD:
        return [(k + 1) * candidates // batch - 1 for k in range(batch)]
    _, m, k = objective
    return weakly_hard(candidates, batch, m, k, history)


def weakly_hard(candidates, batch, m, k, history):
    owed = candidates - batch
    window = max(k - 1, 0)
    recent = list(history[max(len(history) - window, 0):])
    dropped = [False] * candidates
    for i in range(candidates):
        in_window = sum(1 for d in recent[max(len(recent) - window, 0):] if d)
        keep_last = i + 1 == candidates and owed == 0
        drop = owed > 0 and in_window < m and not keep_last
        if drop:
            owed -= 1
        dropped[i] = drop
        recent.append(drop)
    if owed > 0:
        for i in range(candidates - 2, -1, -1):
            if owed == 0:
                break
            if not dropped[i]:
                dropped[i] = True
                owed -= 1
    return [i for i in range(candidates) if not dropped[i]]


def largest_batch_for(model, lat):
    """The largest batch whose processing time P_B satisfies 2·P_B <= L."""
    for b in range(len(model.latency), 0, -1):
        if model.latency[b - 1] * 2 <= lat:
            return b
    return None


class SpreadDrop(Policy):
    OBSERVES = False

    def __init__(self, config: Config):
        config.check_params("spread-drop", PARAMS)
        p = config.params
        self.config = config
        self.model = p.get("model")
        self.batch = p.get("batch")
        self.processing_us = p.get("processing_us")
        self.margin_us = p.get("margin_us", DEFAULT_MARGIN_US)
        weakly_hard_param = p.get("weakly_hard")
        early_drop = p.get("early_drop", False)
        if self.model is not None and config.model_named(self.model) is None:
            raise ValueError(f"spread-drop: unknown model `{self.model}` (valid models: {config.model_names()})")
        if self.batch == 0:
            raise ValueError("spread-drop: param `batch` must be at least 1")
        if self.processing_us == 0:
            raise ValueError("spread-drop: param `processing_us` must be positive")
        if weakly_hard_param is not None and early_drop:
            raise ValueError("spread-drop: `weakly_hard` and `early_drop` exclude each other")
        if weakly_hard_param is not None:
            m, k = weakly_hard_param
            if not m < k:
                raise ValueError(f"spread-drop: param `weakly_hard` [m, K] needs m < K, got [{m}, {k}]")
            self.objective = ("weakly-hard", m, k)
        else:
            self.objective = EARLY_DROP if early_drop else MCD
        self.latency = p.get("latency_us", config.slo)
        if self.latency == 0:
            raise ValueError("spread-drop: the latency SLO L must be positive")
        self.history = []
        self.logged = None
        s = self.setting([m.id for m in config.models])
        if s is not None and s[2] * 2 > self.latency:
            log(Level.WARN, f"spread-drop: 2·P_B = {2 * s[2]} µs exceeds L = {self.latency} µs (§3.1 assumption)")

    def setting(self, loaded):
        """(model id, batch B, processing time P_B), or None when nothing can serve."""
        models = self.config.models
        named = self.config.model_named(self.model) if self.model is not None else None
        if named is not None and named.id in loaded and named.latency:
            model = named
        else:
            fits = [m for m in loaded_models(models, loaded) if largest_batch_for(m, self.latency) is not None]
            model = max(fits, key=lambda m: (m.accuracy, -m.id), default=None) or fastest_model(models, loaded)
            if model is None:
                return None
        batch = self.batch if self.batch is not None else (largest_batch_for(model, self.latency) or 1)
        batch = min(max(batch, 1), len(model.latency))
        processing = self.processing_us if self.processing_us is not None else (latency(model, batch) or 0)
        return (model.id, batch, processing)

    def remember(self, outcomes):
        if self.objective[0] == "weakly-hard":
            self.history.extend(outcomes)
            keep = max(self.objective[2] - 1, 0)
            if len(self.history) > keep:
                del self.history[: len(self.history) - keep]

    def decide(self, view):
        s = self.setting(view.loaded)
        if s is None:
            return Decision.idle()
        model, batch, processing = s
        if self.logged != model:
            self.logged = model
            log(Level.DEBUG, f"spread-drop: model {model} B = {batch} P_B = {processing} µs, {self.objective}")
        queue, lat, now = view.queue, self.latency, view.now
        n = len(queue)
        late = 0
        while late < n and queue[late].arrival + lat < now + processing:
            late += 1
        if late == n:
            self.remember([True] * late)
            return Decision.idle() if late == 0 else Decision.drop_only(model, list(range(late)))
        fire_at = max(queue[late].arrival + lat - processing - self.margin_us, 0)
        if now < fire_at:
            return Decision.wait_until(fire_at)
        horizon = now + 2 * processing
        candidates = 0
        while late + candidates < n and queue[late + candidates].arrival + lat <= horizon:
            candidates += 1
        chosen = select(candidates, batch, self.objective, self.history + [True] * late)
        taken = [False] * candidates
        for c in chosen:
            taken[c] = True
        take = [late + c for c in chosen]
        room = max(batch - len(take), 0)
        extra = min(room, n - late - candidates)
        take.extend(range(late + candidates, late + candidates + extra))
        drop = list(range(late)) + [late + c for c in range(candidates) if not taken[c]]
        self.remember([True] * late + [not t for t in taken] + [False] * extra)
        return Decision.serve(model, take, drop)


WitWorld = export(SpreadDrop)
