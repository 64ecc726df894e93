"""Tests of the Python SDK's layer (plain pytest, no Wasm)."""

import filecmp
import os
import shutil
import subprocess
import tempfile

import pytest

from sluice_policy import Config, Decision, Policy, export, fastest_model, largest_batch_within, latency, most_accurate
from sluice_policy.testing import Harness, Invalid, check_decision, config, linear_model, pending
from wit_world.imports import types as wit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "../../.."))


def models():
    return [linear_model(0, "slow", 0.8, 50, 30, 4), linear_model(1, "fast", 0.7, 10, 5, 4),
            linear_model(2, "fastest", 0.6, 5, 1, 4)]


def test_config_parses_params_and_keeps_host_settings_apart():
    c = Config(config(100, models(), '{"x": 1, "sluice": {"max_batch_wait_us": 5}}'))
    assert c.params == {"x": 1}
    assert c.host_settings == {"max_batch_wait_us": 5}
    assert c.model_named("fast").id == 1 and c.model(7) is None
    assert Config(config(100, models(), "  ")).params == {}
    with pytest.raises(ValueError, match="invalid params"):
        Config(config(100, models(), "[1]"))
    with pytest.raises(ValueError, match="unknown param `y`"):
        Config(config(100, models(), '{"y": 1}')).check_params("p", ["x"])


def test_helpers_follow_the_rust_sdk():
    ms = models()
    assert fastest_model(ms, [0, 1]).id == 1
    assert most_accurate(ms, [1, 2]).id == 1
    assert fastest_model(ms, []) is None
    assert latency(ms[0], 1) == 50 and latency(ms[0], 5) is None
    assert largest_batch_within(ms[1], 20, 8) == 3
    assert largest_batch_within(ms[1], 9, 8) == 0


def test_check_decision_refuses_what_the_host_refuses():
    ms = models()
    v = wit.View(now=10, worker=0, workers=1, load_qps=0.0, loaded=[0, 1], queue=[pending(0, 0, 100)])
    check_decision(ms, v, Decision.serve_head(0, 1))
    check_decision(ms, v, Decision.idle())
    for bad in [Decision.serve_head(2, 1), Decision.serve_head(0, 2), Decision.serve(0, []), Decision.wait_until(10),
                Decision.serve(0, [0], [0]), Decision.serve(9, [0]), None]:
        with pytest.raises(Invalid):
            check_decision(ms, v, bad)


class Head(Policy):
    OBSERVES = False

    def decide(self, view):
        from sluice_policy import log
        log(2, f"{len(view.queue)} queued")
        return Decision.serve_head(0, len(view.queue)) if view.queue else Decision.idle()


def test_harness_captures_logs_and_export_makes_the_world_class():
    h = Harness(Head, config(100, models()))
    assert h.decide(h.view(0, 1.0, [pending(0, 0, 100)])) == Decision.serve_head(0, 1)
    assert h.logs == [(2, "1 queued")]
    world = export(Head)
    assert world.__name__ == "WitWorld" and world.OBSERVES is False


def test_export_refuses_a_class_that_does_not_implement_the_world():
    class NoDecide(Policy):
        pass

    class NotAPolicy:
        pass

    for cls in (NoDecide, NotAPolicy):
        with pytest.raises(TypeError, match="has no decide\\(self, view\\): it does not implement the sluice:policy world"):
            export(cls)


@pytest.mark.skipif(shutil.which("componentize-py") is None and not os.path.exists(os.path.join(ROOT, ".venv/bin/componentize-py")),
                    reason="componentize-py not installed (cargo xtask setup)")
def test_committed_bindings_are_what_componentize_py_generates():
    tool = shutil.which("componentize-py") or os.path.join(ROOT, ".venv/bin/componentize-py")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([tool, "-d", os.path.join(ROOT, "wit"), "-w", "policy-with-status", "bindings", out],
                       check=True, capture_output=True)
        cmp = filecmp.dircmp(out, os.path.join(HERE, "../bindings"), ignore=["__pycache__"])
        differing = cmp.diff_files + cmp.left_only + [f"{d}/{f}" for d, sub in cmp.subdirs.items()
                                                      for f in sub.diff_files + sub.left_only]
        assert not differing, f"regenerate sdk/python/bindings (componentize-py bindings): {differing}"
