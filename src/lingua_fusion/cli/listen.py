"""``linguafusion listen ROOM_ID --token lt_... --to es``: print a room's captions as they arrive, until it ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def listen_room(room_id: str, *, token: str, targets: list[str], after_seq: int, as_json: bool, url: str,
                console: Console) -> int:
    from .. import langs
    from ..sdk import MultimodalTranslator
    from .stream import print_event

    norm = [langs.normalize(t, field="--to") for t in targets]
    client = MultimodalTranslator(base_url=url)
    try:
        def on_break(seconds: float) -> None:
            console.print(f"connection lost; reconnecting (for up to {seconds:g} s)", markup=False, style="yellow")

        for ev in client.listen(room_id, token=token, targets=norm, after_seq=after_seq, on_break=on_break):
            data = ev.model_dump(exclude_none=True)
            print_event(ev.type, data, norm, as_json=as_json, console=console)
            if ev.type == "closed" and not as_json:
                console.print(f"room ended ({data.get('reason')}): {data.get('finals')} captions", style="dim",
                              markup=False)
            if ev.type == "final" and data.get("untranslated"):
                console.print(f"warning: caption {data.get('seq')} was made before anyone listened in "
                              f"{', '.join(data['untranslated'])}: not translated", markup=False, style="yellow")
    finally:
        client.close()
    return 0

