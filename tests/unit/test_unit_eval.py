"""Pure unit tests of the evaluation, degradation and load-generation helpers (no models, no server, no network)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lingua_fusion.errors import InvalidParameter
from lingua_fusion.lab.chaos import degrade
from lingua_fusion.lab.eval import quality
from lingua_fusion.lab.eval.study import knee
from lingua_fusion.lab.loadgen.mix import Mix, StreamKind, load_mix
from lingua_fusion.lab.loadgen.run import StreamResult, _stable, _windows, pct, summarize_run
from lingua_fusion.lab.loadgen.sweep import compare

SR = 16000


def sine(seconds: float = 1.0, freq: float = 440.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# ---- quality -----------------------------------------------------------------------------------------------------

class TestQuality:
    def test_bleu_identical_is_100(self) -> None:
        r = quality.bleu(["the cat sat on the mat", "a dog barked"], ["the cat sat on the mat", "a dog barked"])
        assert r["score"] == 100.0
        assert set(r) == {"score", "signature"}

    def test_bleu_disjoint_is_0(self) -> None:
        assert quality.bleu(["xyz qqq www"], ["the cat sat on the mat"])["score"] == 0.0

    def test_bleu_partial_is_between(self) -> None:
        s = quality.bleu(["the cat sat on a mat"], ["the cat sat on the mat"])["score"]
        assert 0.0 < s < 100.0

    def test_bleu_signature(self) -> None:
        sig = quality.bleu(["a b c d"], ["a b c d"])["signature"]
        assert isinstance(sig, str)
        assert "version:" in sig
        assert "tok:13a" in sig

    def test_chrf_identical_is_100_and_signature(self) -> None:
        r = quality.chrf(["the cat sat on the mat"], ["the cat sat on the mat"])
        assert r["score"] == 100.0
        assert "version:" in r["signature"]
        assert quality.chrf(["zzzz"], ["the cat sat on the mat"])["score"] < 10.0

    def test_wer_hand_computed(self) -> None:
        # one substitution (sat -> sit) and one deletion (the) over 6 reference words
        assert quality.wer(["the cat sit on mat"], ["the cat sat on the mat"]) == pytest.approx(2 / 6, abs=1e-4)

    def test_wer_identical_is_0(self) -> None:
        assert quality.wer(["the cat sat"], ["the cat sat"]) == 0.0

    def test_wer_ignores_punctuation_and_case(self) -> None:
        assert quality.wer(["hello world"], ["Hello, World!"]) == 0.0
        assert quality.wer(["HELLO. world?"], ["hello world"]) == 0.0

    def test_wer_empty_hypothesis_is_all_errors(self) -> None:
        # the empty hypothesis is replaced by one placeholder word: 2 reference words -> 2 errors
        assert quality.wer([""], ["a b"]) == 1.0

    def test_wer_is_corpus_level(self) -> None:
        # 1 error over 2 words + 0 errors over 4 words = 1/6 (not the mean of per-sentence rates, 0.25)
        assert quality.wer(["a x", "b c d e"], ["a b", "b c d e"]) == pytest.approx(1 / 6, abs=1e-4)

    def test_cer_hand_computed(self) -> None:
        assert quality.cer(["abxd"], ["abcd"]) == pytest.approx(0.25, abs=1e-4)
        assert quality.cer(["abcd"], ["abcd"]) == 0.0

    def test_joint_score(self) -> None:
        assert quality.joint_score(40, 0.1, 0.6) == 34.0
        assert quality.joint_score(40, 0.1) == 34.0  # a defaults to 0.6
        assert quality.joint_score(20, 0.5, 1.0) == -30.0


# ---- study -------------------------------------------------------------------------------------------------------

class TestKnee:
    def test_largest_drop(self) -> None:
        # drops: 1, 19, 2 -> the step 1 -> 2
        assert knee([0.0, 1.0, 2.0, 3.0], [40.0, 39.0, 20.0, 18.0]) == 1

    def test_last_step(self) -> None:
        assert knee([0, 1, 2, 3], [40.0, 39.0, 38.0, 10.0]) == 2

    def test_flat_curve(self) -> None:
        assert knee([0, 1, 2, 3], [30.0, 30.0, 30.0, 30.0]) == 0

    def test_single_point(self) -> None:
        assert knee([0.0], [30.0]) == 0


# ---- degrade -----------------------------------------------------------------------------------------------------

class TestDeterminism:
    def test_add_noise(self) -> None:
        x = sine()
        a, b, c = degrade.add_noise(x, 10, seed=1), degrade.add_noise(x, 10, seed=1), degrade.add_noise(x, 10, seed=2)
        assert a.dtype == np.float32 and a.shape == x.shape
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)

    def test_dropouts(self) -> None:
        x = np.full(5 * SR, 0.5, dtype=np.float32)
        (a, ga), (b, gb), (c, gc) = (degrade.dropouts(x, 2.0, seed=s) for s in (3, 3, 4))
        np.testing.assert_array_equal(a, b)
        assert ga == gb
        assert ga != gc
        assert not np.array_equal(a, c)

    def test_drop_mask(self) -> None:
        np.testing.assert_array_equal(degrade.drop_mask(500, 0.2, seed=5), degrade.drop_mask(500, 0.2, seed=5))
        assert not np.array_equal(degrade.drop_mask(500, 0.2, seed=5), degrade.drop_mask(500, 0.2, seed=6))

    def test_jitter(self) -> None:
        a, b, c = degrade.jitter(100, 20, seed=7), degrade.jitter(100, 20, seed=7), degrade.jitter(100, 20, seed=8)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        assert a.shape == (100,)
        assert (a >= 0).all()
        # |N(0, 20 ms)| has mean 20 ms * sqrt(2/pi) ~ 16 ms
        assert 0.010 < float(degrade.jitter(10000, 20, seed=7).mean()) < 0.022


class TestAddNoise:
    @pytest.mark.parametrize("snr_db", [5.0, 10.0, 20.0, 30.0])
    def test_snr(self, snr_db: float) -> None:
        x = sine()
        y = degrade.add_noise(x, snr_db, seed=0)
        assert np.abs(y).max() <= 1.0
        noise = y.astype(np.float64) - x.astype(np.float64)
        measured = 10 * math.log10(float(np.mean(x.astype(np.float64) ** 2)) / float(np.mean(noise ** 2)))
        assert measured == pytest.approx(snr_db, abs=0.5)

    def test_lower_snr_is_noisier(self) -> None:
        x = sine()
        e5 = np.mean((degrade.add_noise(x, 5, seed=0) - x) ** 2)
        e20 = np.mean((degrade.add_noise(x, 20, seed=0) - x) ** 2)
        assert e5 > 10 * e20

    def test_clipped_to_unit_range(self) -> None:
        y = degrade.add_noise(sine(amp=0.9), -10.0, seed=0)
        assert y.min() >= -1.0 and y.max() <= 1.0
        assert (np.abs(y) == 1.0).any()

    def test_input_untouched(self) -> None:
        x = sine()
        keep = x.copy()
        degrade.add_noise(x, 10, seed=0)
        np.testing.assert_array_equal(x, keep)


class TestDropouts:
    def test_gaps(self) -> None:
        dur = 10.0
        x = np.random.default_rng(0).uniform(0.1, 0.9, int(dur * SR)).astype(np.float32)  # never 0
        keep = x.copy()
        out, gaps = degrade.dropouts(x, 2.0, seed=11)
        np.testing.assert_array_equal(x, keep)  # the input is copied, not modified
        assert len(gaps) >= 3
        tol = 0.0011  # gap bounds are rounded to 1 ms
        for a, b in gaps:
            assert 0.0 <= a < b <= dur
            if b < dur:  # the last gap may be cut off by the end of the clip
                assert 0.120 - tol <= b - a <= 0.480 + tol
            else:
                assert b - a <= 0.480 + tol
        for (_, b0), (a1, _) in zip(gaps, gaps[1:], strict=False):
            assert a1 >= b0 - tol  # sorted, not overlapping
        t = np.arange(len(x)) / SR
        inside = np.zeros(len(x), bool)  # surely inside a gap
        near = np.zeros(len(x), bool)  # inside a gap or within rounding of its edges
        for a, b in gaps:
            inside |= (t >= a + tol) & (t < b - tol)
            near |= (t >= a - tol) & (t < b + tol)
        assert (out[inside] == 0.0).all()
        np.testing.assert_array_equal(out[~near], x[~near])
        changed = out != x
        assert not (changed & ~near).any()
        # the zeroed time agrees with the gap lengths (within a couple of samples per gap for rounding)
        assert abs(int(changed.sum()) - sum((b - a) * SR for a, b in gaps)) <= len(gaps) * (tol * SR + 2)

    def test_rate_zero_changes_nothing(self) -> None:
        x = sine(2.0)
        out, gaps = degrade.dropouts(x, 0.0, seed=1)
        assert gaps == []
        np.testing.assert_array_equal(out, x)

    def test_more_gaps_at_higher_rate(self) -> None:
        x = np.ones(30 * SR, dtype=np.float32)
        assert len(degrade.dropouts(x, 3.0, seed=2)[1]) > len(degrade.dropouts(x, 0.5, seed=2)[1])


class TestDropMask:
    def test_keeps_about_80_percent(self) -> None:
        m = degrade.drop_mask(10000, 0.2, seed=0)
        assert m.dtype == bool and m.shape == (10000,)
        assert 0.78 <= float(m.mean()) <= 0.82

    def test_extremes(self) -> None:
        assert degrade.drop_mask(1000, 0.0, seed=0).all()
        assert not degrade.drop_mask(1000, 1.0, seed=0).any()


def edge_image() -> np.ndarray:
    img = np.zeros((32, 40, 3), dtype=np.uint8)
    img[:, 20:] = 255
    return img


class TestImages:
    def test_blur_radius_zero_is_identity(self) -> None:
        img = edge_image()
        out = degrade.blur(img, 0)
        np.testing.assert_array_equal(out, img)

    def test_blur_changes_sharp_edge(self) -> None:
        img = edge_image()
        out = degrade.blur(img, 2)
        assert out.shape == img.shape and out.dtype == np.uint8
        assert not np.array_equal(out, img)
        row = out[16, :, 0].astype(int)
        assert 0 < row[19] < 255 and 0 < row[20] < 255  # intermediate greys at the edge
        assert row[0] == 0 and row[-1] == 255  # far from the edge unchanged

    def test_offset_left(self) -> None:
        img = np.zeros((8, 50, 3), dtype=np.uint8)
        img[:, :, 0] = np.arange(50, dtype=np.uint8)[None, :]  # column index in the red channel
        img[:, :, 1] = 7
        out = degrade.offset(img, -10, 0)
        assert out.shape == img.shape and out.dtype == img.dtype
        np.testing.assert_array_equal(out[:, :40], img[:, 10:])
        assert (out[:, 40:] == 255).all()
        assert out[0, 0, 0] == 10

    def test_offset_down_right(self) -> None:
        img = np.arange(6 * 5 * 3, dtype=np.uint8).reshape(6, 5, 3)
        out = degrade.offset(img, 2, 1)
        np.testing.assert_array_equal(out[1:, 2:], img[:5, :3])
        assert (out[0] == 255).all() and (out[:, :2] == 255).all()

    def test_offset_beyond_the_picture_is_white(self) -> None:
        img = np.zeros((4, 4, 3), dtype=np.uint8)
        assert (degrade.offset(img, -10, 0) == 255).all()


class TestApply:
    def test_unknown_study(self) -> None:
        with pytest.raises(ValueError, match="unknown degradation"):
            degrade.apply("smear", 1.0, audio=sine())

    def test_studies_listed(self) -> None:
        assert set(degrade.STUDIES) == {"noise", "dropout", "blur", "offset"}
        assert degrade.STUDIES["noise"][0] == "speech"
        assert degrade.STUDIES["dropout"][0] == "speech"
        assert degrade.STUDIES["blur"][0] == "slides"
        assert degrade.STUDIES["offset"][0] == "slides"
        for _path, levels, label in degrade.STUDIES.values():
            assert len(levels) >= 2 and label

    def test_dispatch(self) -> None:
        x = sine()
        np.testing.assert_array_equal(degrade.apply("noise", 99.0, audio=x), x)  # 99 dB = clean
        np.testing.assert_array_equal(degrade.apply("noise", 10.0, audio=x, seed=3), degrade.add_noise(x, 10.0, 3))
        np.testing.assert_array_equal(degrade.apply("dropout", 2.0, audio=x, seed=3),
                                      degrade.dropouts(x, 2.0, seed=3)[0])
        img = np.arange(10 * 20 * 3, dtype=np.uint8).reshape(10, 20, 3)
        np.testing.assert_array_equal(degrade.apply("offset", 5.0, image=img), degrade.offset(img, -5, 0))
        np.testing.assert_array_equal(degrade.apply("blur", 0.0, image=img), img)


# ---- mix ---------------------------------------------------------------------------------------------------------

MIX_YAML = """\
arrival: ramp
ramp_s: 7.5
streams:
  - weight: 0.7
    source: synth
    source_lang: en
    targets: [es]
    slo: standard
    importance: 0.5
    partials: true
    slides: true
  - weight: 0.3
    source: text
    targets: [es, ca]
    slo: interactive
"""


class TestMix:
    def test_default(self) -> None:
        m = load_mix(None)
        assert len(m.kinds) == 1
        k = m.kinds[0]
        assert (k.source, k.source_lang, k.targets, k.slo) == ("synth", "en", ["es"], "standard")
        assert m.arrival == "poisson"

    def test_yaml(self, tmp_path: Path) -> None:
        p = tmp_path / "mix.yaml"
        p.write_text(MIX_YAML, encoding="utf-8")
        m = load_mix(p)
        assert m.arrival == "ramp"
        assert m.ramp_s == 7.5
        assert [k.weight for k in m.kinds] == [0.7, 0.3]
        assert [k.source for k in m.kinds] == ["synth", "text"]
        assert [k.targets for k in m.kinds] == [["es"], ["es", "ca"]]
        assert [k.slo for k in m.kinds] == ["standard", "interactive"]
        assert m.kinds[0].slides is True and m.kinds[1].slides is False
        assert m.kinds[1].source_lang == "en"  # default

    def test_unknown_field(self, tmp_path: Path) -> None:
        p = tmp_path / "mix.yaml"
        p.write_text("streams:\n  - weight: 1\n    colour: blue\n", encoding="utf-8")
        with pytest.raises(InvalidParameter, match="colour"):
            load_mix(p)

    def test_bad_arrival(self, tmp_path: Path) -> None:
        p = tmp_path / "mix.yaml"
        p.write_text("arrival: tsunami\nstreams:\n  - weight: 1\n", encoding="utf-8")
        with pytest.raises(InvalidParameter, match="arrival"):
            load_mix(p)

    def test_no_streams(self, tmp_path: Path) -> None:
        p = tmp_path / "mix.yaml"
        p.write_text("arrival: burst\n", encoding="utf-8")
        with pytest.raises(InvalidParameter):
            load_mix(p)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidParameter):
            load_mix(tmp_path / "absent.yaml")

    def test_assign(self) -> None:
        a, b = StreamKind(weight=0.7, source="synth"), StreamKind(weight=0.3, source="text")
        m = Mix([a, b])
        out = m.assign(10, seed=4)
        assert len(out) == 10
        assert sum(k is a for k in out) == 7
        assert sum(k is b for k in out) == 3
        assert [k.source for k in m.assign(10, seed=4)] == [k.source for k in out]
        orders = {tuple(k.source for k in m.assign(10, seed=s)) for s in range(6)}
        assert len(orders) > 1  # the order depends on the seed

    def test_assign_remainder(self) -> None:
        m = Mix([StreamKind(source="a"), StreamKind(source="b"), StreamKind(source="c")])  # equal weights
        for n in (0, 1, 7, 11):
            out = m.assign(n, seed=1)
            assert len(out) == n
            counts = sorted(sum(k.source == s for k in out) for s in "abc")
            assert counts[-1] - counts[0] <= 1


# ---- run ---------------------------------------------------------------------------------------------------------

class TestRunHelpers:
    def test_stable(self) -> None:
        assert _stable([1.0, 1.05]) is True
        assert _stable([5.0, 2.0, 2.1]) is True  # only the last two count
        assert _stable([1.0, 1.3]) is False
        assert _stable([2.0, 1.0]) is False
        assert _stable([1.0]) is False
        assert _stable([]) is False
        assert _stable([None, 1.0, None]) is False  # one real window

    def test_pct(self) -> None:
        assert pct([], 50) is None
        assert pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
        assert pct([0.5, 1.0, 2.0], 99) == 1.98


def sr(slo: str, lats: list[float] | None = None, ends: list[float] | None = None, *, admitted: bool = True,
       rejected: str | None = None, error: str | None = None) -> StreamResult:
    lats = lats or []
    ends = ends or [float(i) for i in range(len(lats))]
    finals = [{"type": "final", "end": e, "text": "hola mundo", "latency_s": lat}
              for e, lat in zip(ends, lats, strict=True)]
    return StreamResult(StreamKind(slo=slo), admitted=admitted, rejected_code=rejected, error=error, finals=finals,
                        latencies=list(lats), sent_s=20.0 if lats else 0.0)


KEYS = ("process_resident_memory_bytes", "process_cpu_seconds_total", "linguafusion_shed_total",
        "linguafusion_streams_rejected_total", "linguafusion_streams_admitted_total",
        "linguafusion_caption_latency_seconds_count", "linguafusion_batch_size_sum",
        "linguafusion_batch_size_count")


class TestSummarizeRun:
    def results(self) -> list[StreamResult]:
        return [
            sr("standard", [1.0, 2.0], [1.0, 5.0]),  # good
            sr("standard", [1.0, 4.0], [11.0, 15.0]),  # p99 3.97 > 3.0: bad
            sr("standard", [0.5], [2.0], error="internal"),  # error: bad
            sr("standard"),  # admitted, no captions: bad
            sr("standard", admitted=False, rejected="overloaded"),
            sr("standard", [3.0], [12.0]),  # p99 exactly the target: good
            sr("interactive", [0.5], [1.0]),  # good
            sr("interactive", [1.5], [12.0]),  # fine for standard, too slow for interactive
        ]

    def before_after(self) -> tuple[dict[str, float], dict[str, float]]:
        before = dict.fromkeys(KEYS, 0.0)
        before.update({"process_cpu_seconds_total": 10.0, "linguafusion_caption_latency_seconds_count": 100.0,
                       "linguafusion_streams_rejected_total": 2.0, "linguafusion_shed_total": 1.0,
                       "linguafusion_batch_size_sum": 10.0, "linguafusion_batch_size_count": 5.0,
                       "process_resident_memory_bytes": 100 * 2**20})
        after = dict(before)
        after.update({"process_cpu_seconds_total": 30.0, "linguafusion_caption_latency_seconds_count": 108.0,
                      "linguafusion_streams_rejected_total": 3.0, "linguafusion_shed_total": 5.0,
                      "linguafusion_batch_size_sum": 40.0, "linguafusion_batch_size_count": 15.0,
                      "process_resident_memory_bytes": 200 * 2**20})
        return before, after

    def test_summary(self) -> None:
        before, after = self.before_after()
        out = summarize_run(self.results(), 8, 20.0, 10.0, before, after, {})
        assert out["streams"] == 8
        assert out["client_captions"] == 8
        std, inter = out["classes"]["standard"], out["classes"]["interactive"]
        assert std["target_p99_s"] == 3.0 and inter["target_p99_s"] == 1.0
        assert std["streams"] == 6 and std["admitted"] == 5
        assert std["goodput_streams"] == 2
        assert inter["goodput_streams"] == 1
        assert out["goodput_streams"] == 3
        assert std["rejected"] == 1 and std["rejected_codes"] == ["overloaded"]
        assert inter["rejected"] == 0
        assert std["errors"] == 1
        assert std["finals"] == 6
        assert std["caption_latency_s"]["p50"] == 1.5  # of 0.5, 1, 1, 2, 3, 4
        assert std["windows_p99_s"] == [1.98, 3.98]  # ends < 10 s: 1, 2, 0.5; ends >= 10 s: 1, 4, 3
        assert std["stable"] is False
        assert std["meets_slo"] is False and inter["meets_slo"] is False and out["meets_slo"] is False
        srv = out["server"]
        assert srv["captions"] == 8.0
        assert srv["rejected"] == 1.0
        assert srv["shed"] == 4.0
        assert srv["cpu_cores_used"] == 2.0  # 20 CPU-seconds over 10 s of wall time
        assert srv["mean_batch"] == 3.0  # 30 items over 10 batches
        assert srv["rss_mib"] == 200.0
        assert sorted(out["latencies"]["standard"]) == [0.5, 1.0, 1.0, 2.0, 3.0, 4.0]
        assert out["latencies"]["interactive"] == [0.5, 1.5]

    def test_all_good_meets_slo(self) -> None:
        before, after = self.before_after()
        rs = [sr("standard", [1.0, 2.0], [1.0, 11.0]), sr("standard", [2.0], [12.0])]
        out = summarize_run(rs, 2, 20.0, 0.0, before, after, {})
        assert out["meets_slo"] is True
        assert out["classes"]["standard"]["goodput_streams"] == 2
        assert out["server"]["cpu_cores_used"] is None  # no wall time

    def test_no_batches(self) -> None:
        before = dict.fromkeys(KEYS, 0.0)
        out = summarize_run([sr("batch", [10.0])], 1, 20.0, 5.0, before, dict(before), {})
        assert out["server"]["mean_batch"] is None
        assert out["server"]["captions"] == 0.0
        assert out["classes"]["batch"]["goodput_streams"] == 1  # 10 s is within the batch class's 30 s

    def test_windows(self) -> None:
        rs = [sr("standard", [1.0, 2.0, 5.0], [3.0, 25.0, 27.0])]
        # 30 s: three full windows; captions in windows 0 and 2 (an empty window is skipped)
        assert _windows(rs, 30.0) == [1.0, pct([2.0, 5.0], 99)]
        # 25 s: the window 20-30 s is partial and left out
        assert _windows(rs, 25.0) == [1.0]


# ---- sweep.compare -----------------------------------------------------------------------------------------------

def report(knee_streams: float, p99: float, p50: float, goodput: float, lats: list[float]) -> dict:
    return {"schema": "linguafusion.bench.load/1", "knee_streams": knee_streams,
            "runs": [{"streams": 4, "goodput_streams": goodput,
                      "classes": {"standard": {"caption_latency_s": {"p50": p50, "p99": p99}}},
                      "latencies": {"standard": lats}}]}


class TestCompare:
    def test_regressions(self) -> None:
        a = report(10, 1.0, 1.0, 4, [1.0, 2.0])
        b = report(8, 1.5, 1.05, 3.8, [9.0, 9.0, 9.0])
        out = compare(a, b, tolerance=0.10)
        keys = {r["metric"] for r in out["regressions"]}
        assert keys == {"knee_streams", "runs[4].classes.standard.caption_latency_s.p99"}
        # knee_streams, runs[4].streams, runs[4].goodput_streams, p50, p99: the latency lists are left out
        assert out["compared"] == 5
        assert not any("latencies" in r["metric"] for r in out["rows"])
        row = {r["metric"]: r for r in out["rows"]}
        assert row["knee_streams"]["change"] == -0.2
        assert row["runs[4].classes.standard.caption_latency_s.p99"]["change"] == 0.5
        assert row["runs[4].classes.standard.caption_latency_s.p50"]["change"] == 0.05

    def test_improvements_are_not_regressions(self) -> None:
        out = compare(report(10, 1.5, 1.0, 4, []), report(14, 0.5, 0.2, 4, []))
        assert out["regressions"] == []
        assert out["compared"] == 5

    def test_tolerance(self) -> None:
        a, b = report(10, 1.0, 1.0, 4, []), report(10, 1.05, 1.0, 4, [])
        assert compare(a, b, tolerance=0.10)["regressions"] == []
        assert [r["metric"] for r in compare(a, b, tolerance=0.01)["regressions"]] == [
            "runs[4].classes.standard.caption_latency_s.p99"]

    def test_identical(self) -> None:
        a = report(10, 1.0, 1.0, 4, [1.0])
        out = compare(a, a)
        assert out["regressions"] == [] and out["compared"] == 5
        assert all(r["change"] == 0.0 for r in out["rows"])
