"""``linguafusion vocab ...``: a key's vocabularies of signs and lip words, through a server (--url) or in-process
(the state directory's vocabularies, owner "local"). Every command prints JSON; errors are ``error [code]: ...``
on stderr with exit status 2, like every other command.

    linguafusion vocab create "my signs" --kind sign
    linguafusion vocab teach VOCAB_ID hello --video hello.mp4     # or --frames hello.json (landmark JSON)
    linguafusion vocab recognise VOCAB_ID --video clip.mp4 --to es
    linguafusion vocab list | show VOCAB_ID | delete VOCAB_ID | forget VOCAB_ID EXAMPLE_ID
    linguafusion vocab export VOCAB_ID -o signs.json; linguafusion vocab import signs.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import InvalidParameter, LinguaFusionError
from ..json_types import JSONValue

if TYPE_CHECKING:
    from ..sdk import LocalTranslator, MultimodalTranslator

    Client = MultimodalTranslator | LocalTranslator

vocab_app = typer.Typer(help="Vocabularies of signs and lip words a key teaches (isolated-sign recognition).",
                        no_args_is_help=True)
URL = typer.Option(None, "--url", envvar="LINGUAFUSION_URL", help="Server URL; without it, run in-process.")
KEY = typer.Option(None, "--api-key", envvar="LINGUAFUSION_API_KEY", help="API key (sk_...).")


def _fail(exc: LinguaFusionError) -> None:
    from .output import fail

    fail(exc)


def _client(url: str | None, api_key: str | None) -> Client:
    from ..sdk import LocalTranslator, MultimodalTranslator

    return MultimodalTranslator(api_key=api_key, base_url=url) if url else LocalTranslator()


def _run(url: str | None, api_key: str | None, call: Callable[[Client], object]) -> None:
    client = None
    try:
        client = _client(url, api_key)
        result = call(client)
    except LinguaFusionError as exc:
        _fail(exc)
    finally:
        if client is not None:
            client.close()
    if result is not None:
        sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")


def _frames(path: Path | None) -> Sequence[Mapping[str, object]] | None:
    if path is None:
        return None
    try:
        doc: JSONValue = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidParameter(f"cannot read --frames {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise InvalidParameter(f"--frames {path} is not JSON") from exc
    frames = doc.get("frames") if isinstance(doc, dict) else doc
    if frames is None:
        return None
    if not isinstance(frames, list) or not all(isinstance(f, dict) for f in frames):
        raise InvalidParameter(f"--frames {path} holds no list of landmark frames (objects)")
    return [f for f in frames if isinstance(f, dict)]


@vocab_app.command("create")
def create(name: str = typer.Argument(..., help="A name for the vocabulary."),
           kind: str = typer.Option("sign", "--kind", help="sign | lip"),
           lang: str = typer.Option("en", "--lang", help="The language the glosses are written in (for MT)."),
           url: str | None = URL, api_key: str | None = KEY) -> None:
    """Create an empty vocabulary; prints its id."""
    _run(url, api_key, lambda c: c.create_vocabulary(name, kind=kind, lang=lang))


@vocab_app.command("list")
def list_(url: str | None = URL, api_key: str | None = KEY) -> None:
    """The key's vocabularies."""
    _run(url, api_key, lambda c: {"vocabularies": c.vocabularies()})


@vocab_app.command("show")
def show(vocab_id: str, url: str | None = URL, api_key: str | None = KEY) -> None:
    """One vocabulary and its examples."""
    _run(url, api_key, lambda c: c.vocabulary(vocab_id))


@vocab_app.command("delete")
def delete(vocab_id: str, url: str | None = URL, api_key: str | None = KEY) -> None:
    """Delete a vocabulary and its examples."""
    _run(url, api_key, lambda c: c.delete_vocabulary(vocab_id) or {"vocabulary_id": vocab_id, "deleted": True})


@vocab_app.command("teach")
def teach(vocab_id: str, gloss: str = typer.Argument(..., help="The sign's or word's label, e.g. hello."),
          video: Path | None = typer.Option(None, "--video", help="A short video of one performance."),
          frames: Path | None = typer.Option(None, "--frames", help="Landmark JSON: a list of frames or "
                                             "{\"frames\": [...]}."),
          url: str | None = URL, api_key: str | None = KEY) -> None:
    """Add one example of GLOSS (a video, or landmark frames)."""
    _run(url, api_key, lambda c: c.add_example(vocab_id, gloss, frames=_frames(frames),
                                               video=str(video) if video else None))


@vocab_app.command("forget")
def forget(vocab_id: str, example_id: str, url: str | None = URL, api_key: str | None = KEY) -> None:
    """Delete one example."""
    _run(url, api_key, lambda c: c.delete_example(vocab_id, example_id) or {"example_id": example_id,
                                                                            "deleted": True})


@vocab_app.command("export")
def export(vocab_id: str, out: Path | None = typer.Option(None, "--out", "-o", help="Write the JSON here."),
           url: str | None = URL, api_key: str | None = KEY) -> None:
    """The whole vocabulary as JSON (to stdout, or -o FILE)."""
    if out is not None:
        _run(url, api_key, lambda c: (c.export_vocabulary(vocab_id, out), None)[1] or
             {"vocabulary_id": vocab_id, "written": str(out)})
    else:
        _run(url, api_key, lambda c: c.export_vocabulary(vocab_id))


@vocab_app.command("import")
def import_(file: Path = typer.Argument(..., help="A file written by `vocab export`."),
            name: str | None = typer.Option(None, "--name", help="A name for the new vocabulary."),
            url: str | None = URL, api_key: str | None = KEY) -> None:
    """Import an exported vocabulary as a new one of this key."""
    _run(url, api_key, lambda c: c.import_vocabulary(str(file), name=name))


@vocab_app.command("recognise")
def recognise(vocab_id: str, video: Path | None = typer.Option(None, "--video", help="A video of signs or words."),
              frames: Path | None = typer.Option(None, "--frames", help="Landmark JSON instead of a video."),
              to: str | None = typer.Option(None, "--to", help="Translate the recognised glosses into this."),
              url: str | None = URL, api_key: str | None = KEY) -> None:
    """Recognise the signs (or the lip word) in a video or landmark JSON, on a timeline."""
    _run(url, api_key, lambda c: c.recognise(vocab_id, frames=_frames(frames), video=str(video) if video else None,
                                             target_lang=to))
