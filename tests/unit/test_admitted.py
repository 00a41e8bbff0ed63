"""``Admitted`` (serving/admitted.py): the admitted streams, and the tightest SLO class on each model, kept as
streams come, go and are admitted again at another class."""

from __future__ import annotations

import pytest

from lingua_fusion.serving.admitted import Admitted, Demand

pytestmark = pytest.mark.timeout(10)


def test_the_tightest_class_on_a_model_follows_the_streams_admitted_on_it() -> None:
    held: Admitted[str] = Admitted()
    assert held.tightest("asr") is None
    held["a"] = Demand("a", "standard", {"asr": 0.5, "mt": 0.4})
    held["b"] = Demand("b", "interactive", {"asr": 0.5})
    held["c"] = Demand("c", "batch", {"mt": 0.4})
    assert (held.tightest("asr"), held.tightest("mt")) == ("interactive", "standard")
    held["b"] = Demand("b", "batch", {"asr": 0.5})  # the same stream again, at another class: counted once
    assert held.tightest("asr") == "standard" and len(held) == 3
    assert held.pop("a").slo == "standard"
    assert (held.tightest("asr"), held.tightest("mt")) == ("batch", "batch")
    assert held.pop("gone", None) is None  # a stream not held: nothing changes
    del held["b"]
    del held["c"]
    assert held.tightest("asr") is None and held.tightest("mt") is None and not held
    held.update({"d": Demand("d", "interactive", {"mt": 1.0})})
    assert list(held) == ["d"] and held["d"].rate == {"mt": 1.0} and held.tightest("mt") == "interactive"
