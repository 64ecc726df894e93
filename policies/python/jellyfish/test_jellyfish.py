"""Jellyfish+ in Python: the Rust crate's tests (policies/jellyfish), same answers."""

import pytest

from sluice_policy import Decision
from sluice_policy.testing import Harness, config, linear_model, pending
from wit_world.imports import types as wit

from jellyfish import Jellyfish

SLO = 100_000


def linear(id, accuracy, base, step, max):
    return linear_model(id, f"m{id}", accuracy, base * 1000, step * 1000, max)


def models():
    return [linear(0, 0.80, 20, 5, 8), linear(1, 0.75, 10, 2, 16), linear(2, 0.60, 5, 1, 32)]


def harness(params=""):
    return Harness(Jellyfish, config(SLO, models(), params))


def queue(n):
    return [pending(i, 0, SLO) for i in range(n)]


def test_most_accurate_model_that_sustains_the_load():
    j = harness().policy
    all_ = [0, 1, 2]
    assert j.choose(0.0, 1, all_) == (0, 7, True)
    assert j.choose(100.0, 1, all_) == (0, 7, True)
    assert j.choose(200.0, 1, all_) == (1, 16, True)
    assert j.choose(500.0, 1, all_) == (2, 32, True)
    assert j.choose(1000.0, 1, all_) == (2, 32, False)
    assert j.choose(100.0, 1, [1, 2]) == (1, 16, True)
    assert j.choose(1000.0, 1, [0, 1]) == (1, 16, False)
    assert j.choose(100.0, 1, []) is None


def test_load_is_split_over_workers_with_headroom():
    assert harness().policy.choose(532.0, 4, [0, 1, 2]) == (0, 7, True)
    assert harness().policy.choose(544.0, 4, [0, 1, 2]) == (1, 16, True)
    assert harness('{"headroom": 1.0}').policy.choose(544.0, 4, [0, 1, 2]) == (0, 7, True)


def test_non_monotone_throughput():
    m = wit.Model(id=0, name="odd", accuracy=0.9, latency=[10_000, 40_000, 24_000, 200_000])
    j = Harness(Jellyfish, config(1_000_000, [m])).policy
    assert j.choose(10.0 / 1.05, 1, [0])[1] == 4
    assert j.choose(30.0 / 1.05, 1, [0])[1] == 3
    assert j.choose(126.0 / 1.05, 1, [0]) == (0, 4, False)


def test_params_and_the_load_grid():
    h = harness('{"max_batch": 4}')
    assert h.decide(h.view(0, 100.0, queue(10))) == Decision.serve(0, [0, 1, 2, 3])
    h = harness('{"load_qps": 200}')
    assert h.decide(h.view(0, 1.0, queue(20))) == Decision.serve_head(1, 16)
    h = harness('{"loads": [500, 100, 200]}')
    for estimate, (model, batch) in [(150.0, (1, 16)), (50.0, (0, 7)), (9000.0, (2, 32))]:
        assert h.decide(h.view(0, estimate, queue(40))) == Decision.serve_head(model, batch)
    slow = [linear(0, 0.8, 40, 10, 8)]
    h = Harness(Jellyfish, config(SLO, slow, '{"overload_batch": "max"}'))
    assert h.decide(h.view(0, 10_000.0, queue(20))) == Decision.serve_head(0, 8)


@pytest.mark.parametrize("params,needle", [('{"headrom": 1}', "headrom"), ('{"headroom": 0}', "headroom"),
                                           ('{"max_batch": 0}', "max_batch"), ('{"load_qps": -1}', "load_qps"),
                                           ('{"loads": []}', "loads"), ('{"overload_batch": "all"}', "all")])
def test_params_errors_name_the_parameter(params, needle):
    assert needle in Harness.init_error(Jellyfish, config(SLO, models(), params))


def test_dispatches_from_the_head_without_dropping():
    h = harness()
    assert h.decide(h.view(0, 100.0, [])) == Decision.idle()
    assert h.decide(h.view(0, 100.0, queue(3))) == Decision.serve(0, [0, 1, 2])
    assert h.decide(h.view(500_000, 100.0, queue(12))) == Decision.serve_head(0, 7)
    h.set_loaded([])
    assert h.decide(h.view(0, 100.0, queue(3))) == Decision.idle()
    assert "status" and h.policy.status().startswith('{"model":null')
