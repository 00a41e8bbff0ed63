"""Mutation testing of the pure cores and the small modules the live path trusts (``make mutation``).

For each module, mutmut (pinned in the ``test`` extra) mutates that one file and runs only the tests that guard it
(``MODULES``), in a scratch copy of the checkout under ``build/mutation/<name>/`` (mutmut works in ``mutants/`` of
its working directory and reads its settings from the ``pyproject.toml`` there, so each module gets its own). The
results are merged into ``bench/results/mutation.json``: per module the mutants, how many the tests killed, how
many survived, timed out (a mutant that loops is caught by the timeout: counted apart, not as killed) or had no
test, the surviving mutants' diffs, and for each survivor either the reason it is equivalent (``EQUIVALENT``) or
nothing, meaning a test is missing.

    .venv/bin/python scripts/mutation.py                     # every module (about 30-40 min on 2 cores)
    .venv/bin/python scripts/mutation.py scheduler journal   # some; the others keep their last results
    make mutation                                            # the same as the first line
    make mutation MODULES="glossary sniff"

It is slow, so it is not in ``make test``: run it after changing a module below, look at the survivors, and kill
them with a test (or add the reason they cannot be killed to ``EQUIVALENT``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PKG = "src/lingua_fusion"
OUT = ROOT / "bench/results/mutation.json"
WORK = ROOT / "build/mutation"

# module -> (file under src/lingua_fusion, the tests that guard it)
MODULES: dict[str, tuple[str, list[str]]] = {
    "scheduler": ("serving/scheduler.py", ["tests/unit/test_unit_scheduler.py", "tests/unit/test_unit_fairness.py",
                                           "tests/unit/test_unit_promises.py", "tests/unit/test_edges_scheduler.py"]),
    "policy": ("stream/policy.py", ["tests/unit/test_unit_policy.py", "tests/unit/test_edges_policy.py"]),
    "breaker": ("stream/breaker.py", ["tests/unit/test_unit_breaker.py", "tests/unit/test_edges_breaker.py"]),
    "timeline": ("stream/ingest.py", ["tests/unit/test_unit_timeline.py", "tests/unit/test_edges_timeline.py"]),
    "journal": ("stream/journal.py", ["tests/unit/test_unit_session.py", "tests/unit/test_unit_promises.py",
                                      "tests/unit/test_edges_journal.py"]),
    "glossary": ("glossary.py", ["tests/unit/test_unit_glossary.py", "tests/unit/test_unit_promises.py",
                                 "tests/unit/test_edges_glossary.py"]),
    "sniff": ("media/sniff.py", ["tests/unit/test_unit_media.py", "tests/unit/test_edges_errors_sniff.py"]),
    "errors": ("errors.py", ["tests/service/test_unit_core.py", "tests/unit/test_edges_errors_sniff.py"]),
}
# a pure core that shares its file with the code around it: only its mutants (mutmut's names, fnmatch) are run
ONLY: dict[str, str] = {"timeline": "*.xǁAudioTimelineǁ*"}  # stream/ingest.py's AudioTimeline

# Survivors that no test can kill, keyed by module and a line of the mutated code (the diff's "+" line, stripped),
# with the reason. A survivor not listed here is a missing test.
SAME_DEFAULT = "the dict entry repeats the default of the only lookup (stage_share.get(stage, 1.0))"
ZIP_DEFAULT = "strict=False is zip's default"
EQUIVALENT: dict[str, dict[str, str]] = {
    "breaker": {
        'self.stage_share = {"XXcaptionXX": 1.0, **(stage_share or {})}': SAME_DEFAULT,
        'self.stage_share = {"CAPTION": 1.0, **(stage_share or {})}': SAME_DEFAULT,
        "return [Transition(slo, at, level, level - 1, round(p99, 3), )]":
            "a restore is only ever decided on the caption stage, Transition's default stage",
    },
    "policy": {
        'return "XXXX".join(c for c in w.lower() if c.isalnum())':
            "_key only compares words with each other; a separator between lower-case alphanumerics keeps the "
            "mapping one-to-one",
        "for x, y in zip(a, b, strict=None):": ZIP_DEFAULT,
        "for x, y in zip(a, b, ):": ZIP_DEFAULT,
        "keep = self.probs[len(self.probs) - after:] if (after and self.probs) or True else []":
            "with after == 0 the slice probs[len(probs):] is already empty, and so is any slice of []",
        "keep = self.probs[len(self.probs) - after:] if after or self.probs else []":
            "with after == 0 the slice probs[len(probs):] is already empty, and so is any slice of []",
        "self.last_speech_end = None":
            "read only while speech_start is set, and every path that sets speech_start sets last_speech_end first",
        "self.probs = None": "overwritten by self.probs = list(keep) at the end of the same method",
        "self.speech_start = t + WINDOW / SR": "only whether speech_start is None is ever read, not its value",
        "self.speech_start = t - WINDOW * SR": "only whether speech_start is None is ever read, not its value",
        "if self.speech_start is not None or self.speech_s > 0:":
            "speech_start and speech_s > 0 are set and reset together (on_vad, _check, committed)",
        "if self.speech_start is not None and self.speech_s >= 0:":
            "speech_s is positive whenever speech_start is set",
    },
    "journal": {
        "self._outage = None  # a not_durable event went out and no durable one yet": "None and False: both falsy",
        "self._outage = None": "None and False: both falsy, and _outage is only ever tested for truth",
        "self.link = StoreLink(None, metrics)": "StoreLink keeps the store but never reads it (calls pass the method)",
        "writer.add_done_callback(lambda t: self._orphans.pop(stream_id, ) if self._orphans.get(stream_id) is t":
            "the key is popped only when get() just found it: the default is never used",
    },
    "glossary": {
        'body = "|".join(re.escape(k) for k in sorted(keys, key=None, reverse=True))':
            "only terms that are prefixes of each other can match at one place, and for those descending text "
            "order is descending length",
        'body = "|".join(re.escape(k) for k in sorted(keys, reverse=True))':
            "only terms that are prefixes of each other can match at one place, and for those descending text "
            "order is descending length",
        "node[end] = None": "the end marker's value is never read (emit skips the end key; only `end in node`)",
        'end = "XXXX"  # the key "" marks a term ending at a node':
            "any key that is not a single character marks the end as well",
        'alt = branches[0] if (len(branches) == 1) and False else "(?:" + "|".join(branches) + ")"':
            "a group around a single branch matches the same strings",
        'return ("(?:" + alt + ")?") if (len(branches) == 1) or True else alt + "?"':
            "alt is already a group when there are several branches: (?:(?:a|b))? matches what (?:a|b)? does",
        'def parse(data: bytes, *, max_terms: int, filename: str = "XXXX") -> list[Term]:':
            "the file name is only tested for a .json ending",
        'text = data.decode("UTF-8-SIG")': "codec names are case-insensitive",
        "rows = list(csv.reader(io.StringIO(text, )))":
            "StringIO's default newline is a line feed: no translation on reading, as with newline=''",
    },
    "sniff": {
        'data[:4096].decode("UTF-8")': "codec names are case-insensitive",
        "h = data[:65]": "the checks read at most the first 12 bytes of h",
    },
    "scheduler": {
        "if var >= 1e-9:": "a weighted variance of exactly 1e-9 cannot come out of integer batch sizes and the "
                           "decay's powers (not equivalent in principle; unreachable)",
        'max_units = self.max_units.get(model.split(":")[0], float("INF"))': 'float("INF") is float("inf")',
        'tightest = float("INF")': 'float("INF") is float("inf")',
        "risk = (ready - item.enqueued) / budget if budget > 1e-3 else 2.0": "risk is clamped to 1 on the next line",
        "risk = 0.0 if risk <= 0.0 else 1.0 if risk > 1.0 else risk": "at exactly 0 both branches give 0",
        "risk = 0.0 if risk < 0.0 else 1.0 if risk >= 1.0 else risk": "at exactly 1 both branches give 1",
    },
    "timeline": {
        "if b < a:": "with b == a both branches return an empty float32 array",
        "if pos <= self.start:  # partly before consumed audio: keep the part after it":
            "with pos == start the trim keeps every sample and leaves pos where it was",
        "elif pos >= self.end:": "with pos == end the gap added is 0 seconds",
        "if need >= len(self.buf):": "with need == len(buf) (never over max_buffer) the buffer is copied unchanged",
        "if need >= self.max_buffer:": "with need == max_buffer the cut is start: nothing is released",
        "if self.start <= min(cut, pos):  # a gap longer than the buffer: release its silence too":
            "with start == min(cut, pos) the assignment leaves start as it was",
    },
}

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no_tests", 33: "no_tests", 36: "timeout", -24: "timeout",
          24: "timeout", 152: "timeout", 255: "timeout", 37: "killed"}


def pyproject(module_file: str, tests: list[str]) -> str:
    """The scratch copy's pyproject.toml: mutmut's settings for this module and the checkout's pytest settings."""
    pytest_opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    lines = ["[tool.mutmut]", 'source_paths = ["src"]', f"only_mutate = {json.dumps([f'{PKG}/{module_file}'])}",
             f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
             'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]', "", "[tool.pytest.ini_options]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in pytest_opts.items()]
    return "\n".join(lines) + "\n"


def run_module(name: str, max_children: int) -> dict[str, Any]:
    module_file, tests = MODULES[name]
    tests = [t for t in tests if (ROOT / t).exists()]
    wd = WORK / name
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    shutil.copytree(ROOT / "src", wd / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", wd / "tests", ignore=ignore)
    (wd / "pyproject.toml").write_text(pyproject(module_file, tests))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.monotonic()
    with open(wd / "run.log", "wb") as log:
        rc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children),
                             *([ONLY[name]] if name in ONLY else [])], cwd=wd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, check=False).returncode
    wall = time.monotonic() - t0
    meta_path = wd / "mutants" / PKG / (module_file + ".meta")
    if rc != 0 or not meta_path.exists():
        tail = (wd / "run.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"mutmut failed on {name} (exit {rc}); see {wd / 'run.log'}:\n{tail}")
    codes: dict[str, int | None] = json.loads(meta_path.read_text())["exit_code_by_key"]
    if name in ONLY:
        codes = {k: c for k, c in codes.items() if fnmatch.fnmatch(k, ONLY[name])}
    counts = {"mutants": len(codes), "killed": 0, "survived": 0, "timeout": 0, "no_tests": 0, "other": 0}
    survivors = []
    for mutant, code in sorted(codes.items()):
        status = STATUS.get(code, "other") if code is not None else "other"
        counts[status] += 1
        if status == "survived":
            diff = subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], cwd=wd, env=env,
                                  capture_output=True, text=True, check=False).stdout
            survivors.append({"mutant": mutant.split(".")[-1], "diff": _short(diff),
                              "equivalent": _equivalent(name, diff)})
    equivalent = sum(1 for s in survivors if s["equivalent"])
    return {"file": f"{PKG}/{module_file}", "tests": tests, **counts,
            "killed_share": round(counts["killed"] / max(1, counts["mutants"]), 3),
            "equivalent": equivalent, "unexplained_survivors": counts["survived"] - equivalent,
            "wall_s": round(wall, 1), "survivors": survivors}


def _short(diff: str) -> str:
    """The mutated lines of ``mutmut show``: what was and what the mutant has."""
    return "\n".join(ln for ln in diff.splitlines()
                     if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


def _equivalent(name: str, diff: str) -> str | None:
    added = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    for line, reason in EQUIVALENT.get(name, {}).items():
        if line in added:
            return reason
    return None


def summarise(modules: dict[str, Any]) -> dict[str, Any]:
    tot = {k: sum(m[k] for m in modules.values()) for k in
           ("mutants", "killed", "survived", "timeout", "no_tests", "other", "equivalent", "unexplained_survivors")}
    tot["killed_share"] = round(tot["killed"] / max(1, tot["mutants"]), 3)
    # equivalent mutants cannot be killed by any test: the share of the killable ones
    tot["killed_share_of_killable"] = round(tot["killed"] / max(1, tot["mutants"] - tot["equivalent"]), 3)
    return tot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    ap.add_argument("--json", type=Path, default=OUT)
    ap.add_argument("--max-children", type=int, default=1, help="parallel mutants (default 1: a shared machine)")
    ap.add_argument("--relabel", action="store_true",
                    help="run nothing: mark the report's survivors again with EQUIVALENT (after editing it)")
    args = ap.parse_args()
    if args.relabel:
        relabel(args.json)
        return
    names = args.modules or list(MODULES)
    if unknown := [n for n in names if n not in MODULES]:
        ap.error(f"unknown modules {unknown}; choose from {list(MODULES)}")
    report: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    modules: dict[str, Any] = report.get("modules", {})
    for name in names:
        print(f"[mutation] {name}: {MODULES[name][0]} with {' '.join(MODULES[name][1])}", flush=True)
        modules[name] = run_module(name, args.max_children)
        m = modules[name]
        print(f"[mutation] {name}: {m['mutants']} mutants, {m['killed']} killed, {m['survived']} survived "
              f"({m['equivalent']} equivalent), {m['timeout']} timeout, {m['no_tests']} no tests, "
              f"{m['wall_s']} s", flush=True)
        report = {"tool": "mutmut " + _version(), "command": "make mutation (scripts/mutation.py)",
                  "commit": _commit(), "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
                  "overall": summarise({k: modules[k] for k in MODULES if k in modules}),
                  "modules": {k: modules[k] for k in MODULES if k in modules}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"[mutation] overall: {json.dumps(report['overall'])}")


def relabel(path: Path) -> None:
    report = json.loads(path.read_text())
    for name, m in report["modules"].items():
        for s in m["survivors"]:
            s["equivalent"] = _equivalent(name, s["diff"])
        m["equivalent"] = sum(1 for s in m["survivors"] if s["equivalent"])
        m["unexplained_survivors"] = m["survived"] - m["equivalent"]
    report["overall"] = summarise(report["modules"])
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"[mutation] overall: {json.dumps(report['overall'])}")


def _version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=False)
    return out.stdout.strip()


if __name__ == "__main__":
    main()
