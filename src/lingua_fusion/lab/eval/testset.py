"""Evaluation test sets: plain folders.

    SET/
      speech/ID.wav (or .mp3 .m4a .ogg .flac .webm)   ID.src.txt (transcript)   ID.<tgt>.txt (reference translation)
      slides/ID.png (or .jpg .webp)                    ID.src.txt (text on it)   ID.<tgt>.txt
      text/ID.src.txt                                                            ID.<tgt>.txt

Each of the three folders may be missing. ``make_builtin(dir)`` writes the project's own small set: sentences we
wrote (data/en_es.tsv, read by ``lab.fixtures.builtin_sentences``) spoken by Piper and rendered as slides,
with our own Spanish references.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import InvalidParameter
from ..fixtures import builtin_sentences, slide_png

MODALITY_DIRS = {"speech": "audio", "slides": "image", "text": "text"}
MEDIA_EXT = {"audio": (".wav", ".mp3", ".m4a", ".ogg", ".flac", ".webm"), "image": (".png", ".jpg", ".jpeg", ".webp")}


@dataclass(frozen=True)
class Item:
    id: str
    modality: str  # audio | image | text
    media: Path | None
    source_ref: str
    target_ref: str


def load(set_dir: Path, source: str, target: str) -> list[Item]:
    if not set_dir.is_dir():
        raise InvalidParameter(f"no test set folder at {set_dir}")
    items: list[Item] = []
    for folder, modality in MODALITY_DIRS.items():
        d = set_dir / folder
        if not d.is_dir():
            continue
        for src in sorted(d.glob("*.src.txt")):
            item_id = src.name[: -len(".src.txt")]
            ref = d / f"{item_id}.{target}.txt"
            if not ref.exists():
                continue
            media = None
            if modality != "text":
                media = next((d / f"{item_id}{e}" for e in MEDIA_EXT[modality] if (d / f"{item_id}{e}").exists()),
                             None)
                if media is None:
                    continue
            items.append(Item(item_id, modality, media, src.read_text(encoding="utf-8").strip(),
                              ref.read_text(encoding="utf-8").strip()))
    if not items:
        raise InvalidParameter(f"{set_dir} holds no items with a .src.txt and a .{target}.txt reference",
                               details={"layout": "speech/ID.wav + ID.src.txt + ID.<tgt>.txt; slides/ID.png ...; "
                                                  "text/ID.src.txt ..."})
    return items


def make_builtin(out: Path) -> Path:
    """Write the built-in en-es set (Piper speech, rendered slides, text) into ``out``."""
    from ...models.tts import PiperTTS, to_wav

    tts = PiperTTS()
    for sub in MODALITY_DIRS:
        (out / sub).mkdir(parents=True, exist_ok=True)
    for i, en, es in builtin_sentences():
        pcm, sr = tts.synthesize(en, language="en")
        (out / "speech" / f"{i}.wav").write_bytes(to_wav(pcm, sr))
        (out / "slides" / f"{i}.png").write_bytes(slide_png(en, font_size=44))
        for sub in MODALITY_DIRS:
            (out / sub / f"{i}.src.txt").write_text(en + "\n", encoding="utf-8")
            (out / sub / f"{i}.es.txt").write_text(es + "\n", encoding="utf-8")
    return out
