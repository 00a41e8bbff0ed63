"""``linguafusion listen ROOM_ID --token lt_... --to es``: print a room's captions as they arrive, until it ends."""

from __future__ import annotations

import json
import sys
from typing import Any


def listen_room(room_id: str, *, token: str, targets: list[str], after_seq: int, as_json: bool, url: str,
                console: Any) -> int:
    from . import langs
    from .sdk import MultimodalTranslator

    norm = [langs.normalize(t, field="--to") for t in targets]
    client = MultimodalTranslator(base_url=url)
    try:
        for ev in client.listen(room_id, token=token, targets=norm, after_seq=after_seq):
            data = ev.model_dump(exclude_none=True)
            if as_json:
                sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
                sys.stdout.flush()
            elif ev.type == "final":
                _print_final(data, norm)
            elif ev.type in ("partial", "revision"):
                console.print(f"  ... {data.get('source_text', '')}", style="dim", markup=False)
            elif ev.type == "closed":
                console.print(f"room ended ({data.get('reason')}): {data.get('finals')} captions", style="dim",
                              markup=False)
            if ev.type == "final" and data.get("untranslated"):
                console.print(f"warning: caption {data.get('seq')} was made before anyone listened in "
                              f"{', '.join(data['untranslated'])}: not translated", markup=False, style="yellow")
    finally:
        client.close()
    return 0


def _print_final(data: dict[str, Any], targets: list[str]) -> None:
    head = f"[{data.get('start', 0):7.2f}-{data.get('end', 0):7.2f}] #{data.get('seq')}"
    translations = data.get("translations") or {}
    if len(targets) == 1:
        sys.stdout.write(f"{head} {data.get('text', '')}\n")
    else:
        sys.stdout.write(f"{head} {data.get('source_text', '')}\n")
        for t in targets:
            sys.stdout.write(f"    {t}: {translations.get(t, '')}\n")
    sys.stdout.flush()
