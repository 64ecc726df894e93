"""spread-drop in Python: the selection rules and decisions of policies/spread-drop."""

from sluice_policy import Decision
from sluice_policy.testing import Harness, config, linear_model, pending

from spread_drop import EARLY_DROP, MCD, SpreadDrop, select, weakly_hard

SLO = 100_000


def models():
    return [linear_model(0, "m", 0.8, 10_000, 2_000, 8)]


def test_select_spreads_drops():
    assert select(3, 4, MCD, []) == [0, 1, 2]
    assert select(6, 3, EARLY_DROP, []) == [0, 1, 2]
    assert select(6, 3, MCD, []) == [1, 3, 5]
    assert select(0, 3, MCD, []) == []
    kept = weakly_hard(6, 3, 1, 2, [])
    assert len(kept) == 3 and kept[-1] == 5


def test_waits_for_the_head_then_serves_or_drops():
    h = Harness(SpreadDrop, config(SLO, models()))
    # Head due at 100 ms; B = 8 (P_8 = 24 ms <= L/2); fire at 100 - 24 - 5 = 71 ms.
    assert h.decide(h.view(0, 10.0, [pending(0, 0, SLO)])) == Decision.wait_until(71_000)
    assert h.decide(h.view(71_000, 10.0, [pending(0, 0, SLO)])) == Decision.serve(0, [0])
    # Everything late: drop it all.
    assert h.decide(h.view(200_000, 10.0, [pending(0, 0, SLO), pending(1, 0, SLO)])) == Decision.drop_only(0, [0, 1])


def test_bad_params_are_named():
    assert "nope" in Harness.init_error(SpreadDrop, config(SLO, models(), '{"model": "nope"}'))
    assert "exclude" in Harness.init_error(SpreadDrop, config(SLO, models(), '{"weakly_hard": [1, 3], "early_drop": true}'))
    assert "m < K" in Harness.init_error(SpreadDrop, config(SLO, models(), '{"weakly_hard": [3, 3]}'))
    assert "extra" in Harness.init_error(SpreadDrop, config(SLO, models(), '{"extra": 1}'))
