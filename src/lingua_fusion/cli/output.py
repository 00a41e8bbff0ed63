"""What the ``linguafusion`` command prints: errors, warnings and results, the same way in every output mode.

Every error is ``error [code]: message`` on stderr with exit status 2; every warning is ``warning: ...`` on stderr,
whatever goes to stdout (plain text, captions, JSON) or to ``-o FILE``. Messages from the engine name request
fields (source_lang, ...); here they name the command's flags (--from, ...). stderr is never hard-wrapped.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

from ..errors import InvalidParameter, LinguaFusionError

if TYPE_CHECKING:
    from ..types import TranslationResult

# soft_wrap: no hard line breaks at 80 columns when stderr is a file or a pipe
err = Console(stderr=True, soft_wrap=True, highlight=False)

FLAGS = {"source_lang": "--from", "target_lang": "--to", "target_langs": "--to", "source_modality": "--modality",
         "target_modality": "--target-modality", "output_format": "--format", "input_media": "FILE",
         "glossary_id": "--glossary", "enable_glossary": "--glossary", "slo": "--slo",
         "diarize": "--diarize", "max_speakers": "--max-speakers", "word_timestamps": "--words"}
_FIELD = re.compile(r"(?<![\w/-])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) + r")(?![\w-])")


def name_flags(message: str) -> str:
    """An engine message in the command's words: "pass source_lang" -> "pass --from"."""
    return _FIELD.sub(lambda m: FLAGS[m.group(1)], message)


def fail(exc: LinguaFusionError) -> NoReturn:
    err.print(f"error [{exc.code}]: {name_flags(exc.message)}", markup=False, style="red")
    raise typer.Exit(2)


def usage(message: str) -> NoReturn:
    fail(InvalidParameter(message))


def warn(warnings: list[str]) -> None:
    for w in warnings:
        err.print(f"warning: {name_flags(w)}", markup=False, style="yellow")


def check_out_path(out: Path | None) -> None:
    """-o must name a file in a folder that exists: checked before any work is done."""
    if out is None:
        return
    if out.is_dir():
        usage(f"-o {out} is a folder; give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        usage(f"-o {out}: the folder {parent} does not exist")


def write_out(out: Path, payload: str | bytes) -> None:
    try:
        if isinstance(payload, bytes):
            out.write_bytes(payload)
        else:
            out.write_text(payload, encoding="utf-8")
    except OSError as exc:
        usage(f"cannot write {out}: {exc.strerror or exc}")
    size = len(payload) if isinstance(payload, bytes) else len(payload.encode("utf-8"))
    err.print(f"wrote {out} ({size} bytes)", markup=False, style="dim")


def render(result: TranslationResult, kind: str, *, karaoke: bool = False) -> str:
    """The result as the chosen output: json (with audio_base64 for speech), srt, vtt (``karaoke``: a line of the
    spoken words timed word by word), or plain text/braille."""
    from ..files.captions import to_srt, to_vtt

    if kind == "json":
        body = result.to_json_dict()
        if result.audio is not None:
            body["audio_base64"] = base64.b64encode(result.audio).decode("ascii")
        return json.dumps(body, ensure_ascii=False) + "\n"
    if kind == "srt":
        return to_srt(result.segments, result.slides)
    if kind == "vtt":
        return to_vtt(result.segments, result.slides, karaoke=karaoke)
    return (result.braille if result.braille is not None else result.text) + "\n"


def emit_report(report: Mapping[str, object], json_out: Path | None) -> None:
    """A tool's JSON report: into ``--json FILE`` when given (stdout stays quiet), else on stdout."""
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if json_out is None:
        sys.stdout.write(text + "\n")
        return
    try:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")
    except OSError as exc:
        usage(f"cannot write {json_out}: {exc.strerror or exc}")
    err.print(f"report written to {json_out}", markup=False, style="dim")
