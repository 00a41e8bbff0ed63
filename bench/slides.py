"""Issue 13: slide-change detection on videos with known change times, OCR calls saved, and slide words as context.

    .venv/bin/python bench/slides.py --json bench/results/slides.json            # both parts
    .venv/bin/python bench/slides.py --part detect --json /tmp/d.json            # detection only (no models)

Part ``detect``: videos rendered with lab/slidevideo.py (PIL slides, encoded to H.264 with PyAV and decoded back
through video/decode.py at 2 fps, as the file path reads them), slides changing at random known times, in five
conditions: clean cuts; cross-fades of 1 s; a wandering mouse cursor; camera noise (std 8) with auto-exposure
flicker (+-10 grey levels); a whiteboard that gains one line at a time (each new line is a change); a moving
picture-in-picture speaker inset (a fifth of the width, bottom right: it moves in every frame).
Each sampled frame goes through the detector (video/slides.py). A detection matches a true change when its start
lies within [change - 0.5 s, change + 1.0 s + fade length]; precision = matched / detections, recall = matched /
changes; start error is |detected start - true change| over the matched ones. Baseline in the same run: naive
differencing (mean absolute difference between consecutive sampled frames above 2 grey levels, no settling, no
median removal, no uniform-region skip) on the same frames. OCR calls: the detector's (one per detection) vs OCR on
every sampled frame; the seconds that saves use the RapidOCR time measured here on the same frames.

Part ``context``: a talk whose speech says technical terms written on its slides (Kubernetes, PostgreSQL, ...), in
piper's voice and espeak-ng's (harder: tiny.en's WER on espeak is ~14 %), through FileTranslator en -> es twice:
slide context off (``slide_context = False``) and on (each slide's audio prompted with its words; names kept as
written by MT). WER of the transcript against the sentences said (jiwer, lower-cased, punctuation removed); term
accuracy = terms spelt right in the transcript / terms said, and in the Spanish text.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from lingua_fusion.lab.slidevideo import Nuisance, SlideSpec, slide_video  # noqa: E402

WORDS = ("revenue growth market team office budget plan launch customer design review release security cloud data "
         "model training hiring roadmap partner sales support quality testing metrics goals risks").split()


def random_talk(rng: random.Random, duration: float, whiteboard: bool = False) -> list[SlideSpec]:
    t, slides = 0.0, []
    n = 0
    lines: list[str] = []
    while t < duration - 2.0:
        n += 1
        if whiteboard:
            lines.append(" ".join(rng.sample(WORDS, 3)))
            slides.append(SlideSpec(round(t, 2), "Whiteboard notes", tuple(lines[-5:])))
        else:
            slides.append(SlideSpec(round(t, 2), f"{rng.choice(WORDS).title()} {rng.choice(WORDS)} {n}",
                                    tuple(" ".join(rng.sample(WORDS, 4)) for _ in range(rng.randint(1, 4)))))
        t += rng.uniform(2.5, 7.0)
    return slides


CONDITIONS: dict[str, dict[str, Any]] = {
    "clean": {"nuisance": Nuisance()},
    "fades": {"nuisance": Nuisance(fade_s=1.0)},
    "cursor": {"nuisance": Nuisance(cursor=True)},
    "noise_flicker": {"nuisance": Nuisance(noise=8.0, flicker=10.0)},
    "whiteboard": {"nuisance": Nuisance(cursor=True, noise=3.0), "whiteboard": True},
    "webcam_inset": {"nuisance": Nuisance(webcam=True, noise=3.0)},
}


def naive_changes(frames: list[tuple[float, np.ndarray]]) -> list[float]:
    from lingua_fusion.video.slides import signature

    out, prev = [], None
    for t, rgb in frames:
        sig = signature(rgb)
        if prev is None or float(np.abs(sig - prev).mean()) > 2.0:
            out.append(t)
        prev = sig
    return out


def ours(frames: list[tuple[float, np.ndarray]]) -> tuple[list[float], float]:
    from lingua_fusion.video.slides import SlideDetector, signature

    det = SlideDetector()
    t0 = time.perf_counter()
    found = [c.start for t, rgb in frames if (c := det.observe(t, signature(rgb))) is not None]
    last = det.finish(frames[-1][0])
    per_frame = (time.perf_counter() - t0) / len(frames)
    return found + ([last.start] if last else []), per_frame


def match(truth: list[float], found: list[float], fade: float) -> tuple[int, list[float]]:
    used, errors = set(), []
    for c in truth:
        best = None
        for i, f in enumerate(found):
            if i not in used and c - 0.5 <= f <= c + 1.0 + fade and (best is None or abs(f - c) < abs(found[best] - c)):
                best = i
        if best is not None:
            used.add(best)
            errors.append(abs(found[best] - c))
    return len(used), errors


def detect_part(videos: int, duration: float, seed: int) -> dict[str, Any]:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.video.decode import decode_frames

    rng = random.Random(seed)
    out: dict[str, Any] = {}
    sample_frames: list[np.ndarray] = []
    for name, cond in CONDITIONS.items():
        agg = {"changes": 0, "ours": {"found": 0, "matched": 0, "errors": []}, "naive": {"found": 0, "matched": 0},
               "frames": 0, "per_frame_ms": []}
        for v in range(videos):
            slides = random_talk(rng, duration, cond.get("whiteboard", False))
            data = slide_video(slides, duration, fps=10, size=(960, 540), nuisance=cond["nuisance"], seed=seed + v)
            frames: list[tuple[float, np.ndarray]] = []
            decode_frames(data, LimitSettings(), lambda f: frames.append((f.t, f.rgb)), fps=2.0)  # noqa: B023
            if len(sample_frames) < 6:
                sample_frames.append(frames[len(frames) // 2][1])
            truth = [s.t for s in slides]
            fade = cond["nuisance"].fade_s
            found, per_frame = ours(frames)
            m, errs = match(truth, found, fade)
            naive = naive_changes(frames)
            nm, _ = match(truth, naive, fade)
            agg["changes"] += len(truth)
            agg["frames"] += len(frames)
            agg["ours"]["found"] += len(found)
            agg["ours"]["matched"] += m
            agg["ours"]["errors"] += errs
            agg["naive"]["found"] += len(naive)
            agg["naive"]["matched"] += nm
            agg["per_frame_ms"].append(per_frame * 1000)
        o, n = agg["ours"], agg["naive"]
        out[name] = {
            "videos": videos, "changes": agg["changes"], "frames_sampled": agg["frames"],
            "precision": round(o["matched"] / max(1, o["found"]), 3), "recall": round(o["matched"] / agg["changes"], 3),
            "start_error_mean_s": round(float(np.mean(o["errors"])) if o["errors"] else 0.0, 3),
            "start_error_max_s": round(float(np.max(o["errors"])) if o["errors"] else 0.0, 3),
            "ocr_calls": o["found"], "ocr_calls_every_frame": agg["frames"],
            "ocr_calls_saved": round(1 - o["found"] / agg["frames"], 3),
            "naive_precision": round(n["matched"] / max(1, n["found"]), 3),
            "naive_recall": round(n["matched"] / agg["changes"], 3), "naive_detections": n["found"],
            "detector_ms_per_frame": round(float(np.mean(agg["per_frame_ms"])), 2),
        }
        print(f"{name:14s} precision {out[name]['precision']:.3f} recall {out[name]['recall']:.3f} "
              f"start err mean {out[name]['start_error_mean_s']:.2f} s max {out[name]['start_error_max_s']:.2f} s | "
              f"OCR {o['found']} vs {agg['frames']} frames ({out[name]['ocr_calls_saved']:.1%} saved) | naive "
              f"precision {out[name]['naive_precision']:.3f} recall {out[name]['naive_recall']:.3f}", flush=True)
    from lingua_fusion.models.ocr import RapidOCRBackend

    ocr = RapidOCRBackend()
    ocr.recognize(sample_frames[0])  # warm
    t0 = time.perf_counter()
    for f in sample_frames:
        ocr.recognize(f)
    ocr_s = (time.perf_counter() - t0) / len(sample_frames)
    total_frames = sum(v["frames_sampled"] for v in out.values())
    total_calls = sum(v["ocr_calls"] for v in out.values())
    detector_ms = float(np.mean([v["detector_ms_per_frame"] for v in out.values()]))
    summary = {"ocr_s_per_frame_960x540": round(ocr_s, 3), "frames": total_frames, "ocr_calls": total_calls,
               "ocr_seconds_every_frame": round(total_frames * ocr_s, 1),
               "ocr_seconds_ours": round(total_calls * ocr_s + total_frames * detector_ms / 1000, 1)}
    summary["cpu_ratio_every_frame_vs_ours"] = round(summary["ocr_seconds_every_frame"]
                                                     / max(1e-9, summary["ocr_seconds_ours"]), 1)
    print(f"OCR {ocr_s:.2f} s a frame: every frame {summary['ocr_seconds_every_frame']} s vs ours "
          f"{summary['ocr_seconds_ours']} s (detector included): {summary['cpu_ratio_every_frame_vs_ours']}x")
    return {"conditions": out, "summary": summary}


# ---- slide words as context ----------------------------------------------------------------------------------
TALK = [  # (slide title, slide lines, what is said while it shows, the terms said that are on the slide)
    ("Kubernetes cluster", ("Every service runs on Kubernetes", "Helm charts for each release"),
     "We deploy every service on Kubernetes with Helm charts.", ("Kubernetes", "Helm")),
    ("PostgreSQL replication", ("Streaming replication to two replicas", "Failover with Patroni"),
     "The database uses PostgreSQL streaming replication and Patroni for failover.", ("PostgreSQL", "Patroni")),
    ("Grafana dashboards", ("Prometheus collects the metrics", "Alerts go to Opsgenie"),
     "Prometheus collects the metrics and Grafana shows them, alerts go to Opsgenie.",
     ("Prometheus", "Grafana", "Opsgenie")),
    ("Terraform modules", ("Infrastructure lives in Terraform", "Reviewed in Atlantis"),
     "All infrastructure lives in Terraform modules, reviewed in Atlantis.", ("Terraform", "Atlantis")),
    ("Kafka topics", ("Events flow through Kafka", "Schemas in Avro"),
     "Events flow through Kafka topics with Avro schemas.", ("Kafka", "Avro")),
    ("Sentry and Jaeger", ("Errors are tracked in Sentry", "Traces in Jaeger"),
     "Errors are tracked in Sentry and traces in Jaeger.", ("Sentry", "Jaeger")),
]


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def context_video(voice: str) -> tuple[bytes, list[str], list[str]]:
    from lingua_fusion.lab.slidevideo import speech_track
    from lingua_fusion.models.tts import EspeakTTS, PiperTTS

    tts: Any = PiperTTS() if voice == "piper" else EspeakTTS()
    parts, slides, t = [], [], 0.0
    for title, lines, said, _terms in TALK:
        pcm, sr = tts.synthesize(said, language="en")
        slides.append(SlideSpec(t, title, lines))
        parts.append((t + 0.6, pcm, sr))
        t += 0.6 + pcm.size / sr + 1.2
    track = speech_track(parts)
    video = slide_video(slides, t, speech=track, size=(960, 540), nuisance=Nuisance(cursor=True, noise=2.0))
    return video, [s for _a, _b, s, _c in TALK], [term for *_x, terms in TALK for term in terms]


def context_part(voices: list[str]) -> dict[str, Any]:
    import jiwer

    from lingua_fusion.files import FileRequest, FileTranslator

    tr = FileTranslator()
    out: dict[str, Any] = {}
    for voice in voices:
        video, said, terms = context_video(voice)
        ref = norm(" ".join(said))
        row: dict[str, Any] = {"terms_said": len(terms), "sentences": len(said)}
        for mode in ("off", "on"):
            tr.slide_context = mode == "on"
            t0 = time.perf_counter()
            r = tr.translate(FileRequest(source_modality="video", data=video, source_lang="en", target_lang="es"))
            secs = time.perf_counter() - t0
            hyp = norm(r.source_text)
            row[mode] = {
                "wer": round(float(jiwer.wer(ref, hyp)), 4),
                "term_accuracy_transcript": round(sum(norm(t) in hyp.split() for t in terms) / len(terms), 3),
                "term_accuracy_translation": round(sum(t in r.text for t in terms) / len(terms), 3),
                "segments": len(r.segments), "slides": len(r.slides), "seconds": round(secs, 1),
                "transcript": r.source_text, "translation": r.text,
            }
            print(f"{voice:6s} context {mode:3s}: WER {row[mode]['wer']:.3f} terms in transcript "
                  f"{row[mode]['term_accuracy_transcript']:.2f} in translation "
                  f"{row[mode]['term_accuracy_translation']:.2f} ({row[mode]['segments']} segments, {secs:.1f} s)",
                  flush=True)
        out[voice] = row
    tr.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("detect", "context", "all"), default="all")
    ap.add_argument("--videos", type=int, default=4, help="videos per detection condition")
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--voices", default="piper,espeak")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from lingua_fusion.lab.fixtures import git_commit, machine

    report: dict[str, Any] = {"commit": git_commit(), "machine": machine(), "args": {k: str(v) for k, v in
                                                                                    vars(args).items()}}
    if args.part in ("detect", "all"):
        report["detect"] = detect_part(args.videos, args.duration, args.seed)
    if args.part in ("context", "all"):
        report["context"] = context_part(args.voices.split(","))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
