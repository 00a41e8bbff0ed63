"""``linguafusion translate | stream | listen | models``: a file, a live stream, a room, what is served."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from ..errors import InvalidParameter, LinguaFusionError
from .app import KEY_OPT, URL_OPT, _fail, app
from .output import check_out_path, err, fail, render, usage, warn, write_out


@app.command()
def translate(
    file: Path | None = typer.Argument(None, help="Input file: audio, video, image, or UTF-8 text (.txt, .md)."),
    to: str = typer.Option(..., "--to", help="Target language, e.g. es."),
    source_lang: str | None = typer.Option(None, "--from", help="Source language (detected if omitted)."),
    text: str | None = typer.Option(None, "--text", help="Translate this text instead of a file."),
    modality: str | None = typer.Option(None, "--modality",
                                        help="audio | video | image | text (default: told by the file's bytes)."),
    target_modality: str = typer.Option("text", "--target-modality", help="text | speech (WAV) | braille"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object (speech: with audio_base64)."),
    fmt: str | None = typer.Option(None, "--format", help="srt | vtt captions instead of plain text."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                    help="Write the output here instead of stdout (speech: the WAV)."),
    glossary: Path | None = typer.Option(None, "--glossary", help="CSV/JSON term list to apply."),
    vocabulary: str | None = typer.Option(None, "--vocabulary",
                                          help="A sign vocabulary's id: the video's signs are read (JSON: signs)."),
    diarize: bool = typer.Option(False, "--diarize",
                                 help="Speech: who spoke each segment (JSON: segments[].speaker; SRT/VTT name them)."),
    max_speakers: int | None = typer.Option(None, "--max-speakers", help="With --diarize: at most this many."),
    words: bool = typer.Option(False, "--words", help="Speech: each segment's spoken words with their times "
                               "(--json: segments[].words; --format vtt: karaoke cues)."),
    url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
) -> None:
    """Translate a file or text, through a server (--url) or in-process. Warnings go to stderr."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..sdk import LocalTranslator, MultimodalTranslator

    kind = _output_kind(file, text, as_json, fmt, target_modality, out)
    if words and kind not in ("json", "vtt"):
        usage("--words adds word times to --json (segments[].words) or karaoke cues to --format vtt: give one")
    try:
        client = MultimodalTranslator(api_key=api_key, base_url=url) if url else LocalTranslator()
        gid = client.upload_glossary(glossary) if glossary else None
        label = f"translating {file.name if file else 'text'} -> {to}"
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                      transient=True, disable=not err.is_terminal) as progress:
            progress.add_task(label, total=None)
            result = client.translate(str(file) if file else None, text=text, target_lang=to,
                                      source_lang=source_lang, source_modality=modality,
                                      target_modality=target_modality, enable_glossary=gid is not None,
                                      glossary_id=gid, vocabulary_id=vocabulary, diarize=diarize,
                                      max_speakers=max_speakers, word_timestamps=words)
    except LinguaFusionError as exc:
        fail(exc)
    warn(result.warnings)
    if kind == "wav":  # speech: the WAV goes to -o, the translated text to stdout
        assert out is not None and result.audio is not None
        write_out(out, result.audio)
        sys.stdout.write(result.text + "\n")
        return
    if kind == "json" and out is not None and result.audio is not None:
        write_out(out.with_suffix(".wav") if out.suffix.lower() == ".json" else out, result.audio)
        sys.stdout.write(render(result, kind))
        return
    if out is not None:
        write_out(out, render(result, kind, karaoke=words))
    else:
        sys.stdout.write(render(result, kind, karaoke=words))


def _output_kind(file: Path | None, text: str | None, as_json: bool, fmt: str | None, target_modality: str,
                 out: Path | None) -> str:
    """Which output the flags ask for (json | srt | vtt | text | wav), refused before any work when they do not
    fit together."""
    if file is None and text is None:
        usage("give a FILE or --text")
    if file is not None and text is not None:
        usage(f"give a FILE or --text, not both ({file} and --text)")
    if fmt is not None and fmt.lower() not in ("srt", "vtt"):
        usage(f"--format must be srt or vtt, not {fmt!r}")
    if fmt and as_json:
        usage("--json and --format both choose the output: give one")
    modality = target_modality.strip().lower()
    if fmt and modality != "text":
        usage(f"--format {fmt} makes captions of translated text; --target-modality {modality} has no caption "
              "form: drop --format" + (" (braille is printed as cells)" if modality == "braille" else ""))
    if modality == "speech" and out is None and not as_json:
        usage("--target-modality speech makes a WAV: pass -o FILE.wav to keep it (or --json for audio_base64)")
    check_out_path(out)
    if as_json:
        return "json"
    if fmt:
        return fmt.lower()
    return "wav" if modality == "speech" else "text"


@app.command()
def stream(
    file: Path = typer.Argument(..., help="Audio (or video) file played as a live stream."),
    to: list[str] = typer.Option(..., "--to", help="Target language(s); repeat for several."),
    source_lang: str | None = typer.Option(None, "--from", help="Spoken language (detected from the file if omitted; "
                                           "auto: detected per utterance by the server)."),
    slo: str = typer.Option("standard", "--slo", help="interactive | standard | batch"),
    realtime: bool = typer.Option(False, "--realtime", help="Pace the audio at real time."),
    chunk_ms: int = typer.Option(250, "--chunk-ms"),
    partials: bool = typer.Option(True, "--partials/--no-partials"),
    as_json: bool = typer.Option(False, "--json", help="One JSON event per line."),
    url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
    room: bool = typer.Option(False, "--room", help="Publish the stream as a room; prints its room_id and "
                              "listener_token (with --json: the ready event) for `linguafusion listen`."),
    allow: list[str] = typer.Option([], "--allow", help="With --room: another language its listeners may ask for "
                                    "(repeat; default: only the --to languages)."),
    diarize: bool = typer.Option(False, "--diarize", help="Each caption's speaker (S1, S2, ...)."),
    words: bool = typer.Option(False, "--words", help="Each final's spoken words with their times (with --json: "
                               "the final's words; else printed under the caption)."),
) -> None:
    """Play FILE as a live stream and print captions as they arrive."""
    import asyncio

    from .stream import play_file

    try:
        code = asyncio.run(play_file(file, targets=to, source_lang=source_lang, slo=slo, realtime=realtime,
                                     chunk_ms=chunk_ms, partials=partials, as_json=as_json, url=url,
                                     api_key=api_key, console=err, room=room, allow=allow, diarize=diarize,
                                     words=words))
    except LinguaFusionError as exc:
        _fail(exc)
        return
    raise typer.Exit(code)


@app.command()
def listen(
    room_id: str = typer.Argument(..., help="The room (rm_...), as the publisher's ready event names it."),
    token: str = typer.Option(..., "--token", envvar="LINGUAFUSION_LISTENER_TOKEN",
                              help="The room's listener token (lt_...): read-only."),
    to: list[str] = typer.Option(..., "--to", help="Language(s) to hear; repeat for several."),
    after_seq: int = typer.Option(0, "--after-seq", help="Resume: only captions after this seq."),
    as_json: bool = typer.Option(False, "--json", help="One JSON event per line."),
    url: str | None = typer.Option(None, "--url", envvar="LINGUAFUSION_URL",
                                   help="The server hosting the room (required: rooms live on a server)."),
) -> None:
    """Listen to a room: its captions in your languages, as they come, until the room ends."""
    from .listen import listen_room

    try:
        if not url:
            raise InvalidParameter("listen needs the server: give --url (or LINGUAFUSION_URL)")
        code = listen_room(room_id, token=token, targets=to, after_seq=after_seq, as_json=as_json, url=url,
                           console=err)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    raise typer.Exit(code)


@app.command()
def models(url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
           as_json: bool = typer.Option(False, "--json", help="One JSON object: models, pairs, routes.")) -> None:
    """What each installed model can do (task, languages, licence, quality), and every translation pair with
    its route and quality tier: "low-confidence" pairs go through the tiny LLM (slow, often wrong)."""
    from rich.table import Table

    from ..sdk.answers import ModelsJSON, is_models

    try:
        caps: ModelsJSON
        if url:
            from ..sdk import MultimodalTranslator

            caps = MultimodalTranslator(api_key=api_key, base_url=url).models()
        else:
            from ..config import Settings
            from ..errors import BackendError
            from ..models.registry import Registry

            reg = Registry(Settings())
            local = {"models": reg.capabilities(), "pairs": reg.served_pairs(), "routes": reg.pair_routes()}
            if not is_models(local):  # the registry's own lists: always of that shape
                raise BackendError("the model registry listed its models in another shape")
            caps = local
    except LinguaFusionError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(caps, ensure_ascii=False) + "\n")
        return
    # a pipe or a file gets whole lines: no column is cut to fit 80 characters
    console = Console() if sys.stdout.isatty() else Console(width=240, soft_wrap=True)
    table = Table("task", "model", "languages / pairs", "licence", "quality", title="models")
    for m in caps["models"]:
        span = ", ".join(m["pairs"]) or ", ".join(m["languages"][:12]) + (" ..." if len(m["languages"]) > 12 else "")
        table.add_row(m["task"], m["name"], span, m["licence"], m["quality"])
    table.columns[1].no_wrap = True
    console.print(table)
    routes = Table("pair", "route", "quality", title="translation pairs (a pivot is two legs)")
    for r in caps.get("routes", []):
        tier = r["tier"] + (f" (tiny LLM x{r['llm_legs']})" if r["llm_legs"] else "")
        if r.get("available") is False:  # its worker is in a crash loop (supervise/): refused until it recovers
            tier += f"; unavailable: {r.get('unavailable_reason', '')}"
        routes.add_row(r["pair"], r["route"], tier, style="red" if r.get("available") is False
                       else "yellow" if r["low_confidence"] else None)
    routes.columns[0].no_wrap = routes.columns[1].no_wrap = True
    console.print(routes)
    if not caps.get("routes"):  # an older server: pairs only
        console.print("translation pairs served: " + ", ".join(caps["pairs"]))


