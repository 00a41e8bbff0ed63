"""Speaker diarization of files: DER and time-weighted speaker agreement on dialogues built from different voices.

Each scenario is a dialogue of synthetic voices with known turns (lab/diarize/dialogue.py: Piper's joe, espeak-ng's
en-us and en+f3), run through the file path as ``linguafusion translate FILE --to es --diarize`` runs it
(FileTranslator: Whisper segments, then each segment's speaker), and scored against its turns
(lab/diarize/der.py, our own DER: missed + false alarm + confusion over reference speech, optimal one-to-one label
mapping; reported without a collar and with NIST's 0.25 s). The same voices read different sentences in each
scenario; "short" turns are 1-4 words; "overlap" turns start 0.3 s before the previous one ends.

    .venv/bin/python bench/diarize.py --json bench/results/diarize.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.config import Settings  # noqa: E402
from lingua_fusion.files import FileRequest, FileTranslator  # noqa: E402
from lingua_fusion.lab.diarize.der import score  # noqa: E402
from lingua_fusion.lab.diarize.dialogue import build, hypothesis  # noqa: E402
from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402

LINES = [
    "Good morning, thank you all for coming to the planning meeting today.",
    "Thanks. Could we start with the budget for the next quarter?",
    "Of course. Revenue grew by twelve percent, and costs stayed flat.",
    "That is good news. What about the hiring plan for the new team?",
    "We want to hire two engineers and one designer before the summer.",
    "I think we also need someone to support our customers in Spain.",
    "Agreed. Let us put that on the list and decide next week.",
    "One more thing: the office will be closed on Friday for repairs.",
    "Then I will send the notes to everyone by Thursday evening.",
]
SHORT = ["Yes.", "Are you sure?", "Absolutely.", "Why not today?", "Too late now.", "Fine, tomorrow then.",
         "Good.", "See you there.", "Thank you."]
SCENARIOS: dict[str, tuple[tuple[str, ...], list[str], float]] = {
    "two voices (joe, en+f3)": (("joe", "en+f3"), LINES[:8], 0.5),
    "two espeak voices (en-us, en+f3)": (("en-us", "en+f3"), LINES[1:9], 0.5),
    "three voices (joe, en-us, en+f3)": (("joe", "en-us", "en+f3"), LINES, 0.5),
    "short turns (joe, en+f3)": (("joe", "en+f3"), SHORT, 0.4),
    "overlap 0.3 s (joe, en-us)": (("joe", "en-us"), LINES[:6], -0.3),
}


def run(translator: FileTranslator, voices: tuple[str, ...], lines: list[str], pause: float) -> dict[str, Any]:
    dialogue = build([(voices[i % len(voices)], t) for i, t in enumerate(lines)], pause_s=pause)
    t0 = time.perf_counter()
    result = translator.translate(FileRequest(source_modality="audio", target_lang="es", source_lang="en",
                                              data=dialogue.wav, diarize=True))
    wall = time.perf_counter() - t0
    segs = [s.model_dump() for s in result.segments]
    hyp = hypothesis(segs)
    plain, collared = score(dialogue.turns, hyp), score(dialogue.turns, hyp, collar=0.25)
    return {"voices": list(voices), "turns": len(lines), "audio_s": round(dialogue.duration, 2),
            "speakers_true": len(set(voices)), "speakers_found": plain.speakers_found,
            "der": plain.to_json(), "der_collar_0.25": collared.to_json(), "wall_s": round(wall, 2),
            "diarize_ms": result.latency_ms.get("diarize"),
            "segments": [{k: s[k] for k in ("start", "end", "speaker", "speaker_confidence", "source_text")}
                         for s in segs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args()
    translator = FileTranslator(Settings())
    report: dict[str, Any] = {"machine": machine(), "commit": git_commit(), "scenarios": {}}
    try:
        print(f"{'scenario':36} {'spk':>7} {'DER':>7} {'DER c.25':>9} {'agree':>7} {'diar ms':>8}")
        for name, (voices, lines, pause) in SCENARIOS.items():
            r = report["scenarios"][name] = run(translator, voices, lines, pause)
            print(f"{name:36} {r['speakers_found']:>3}/{r['speakers_true']:<3} {r['der']['der']:>7.1%} "
                  f"{r['der_collar_0.25']['der']:>9.1%} {r['der']['agreement']:>7.1%} {r['diarize_ms'] or 0:>8.0f}")
    finally:
        translator.close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
