"""The ``linguafusion`` command: serve | translate | models | keys | glossary | bench."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperOption

from .cli_output import check_out_path, emit_report, err, fail, render, usage, warn, write_out
from .errors import InvalidParameter, LinguaFusionError
from .vision.cli import vocab_app

app = typer.Typer(help="LinguaFusion: real-time multimodal translation server, SDK and CLI.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
keys_app = typer.Typer(help="Manage API keys in the server's state directory.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
bench_app = typer.Typer(help="Benchmarks: file latency, live load against a server, comparison of reports.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")
chaos_app = typer.Typer(help="Chaos experiments: faults on a schedule under load, against a baseline.",
                        no_args_is_help=True)
app.add_typer(chaos_app, name="chaos")
app.add_typer(vocab_app, name="vocab")  # vision/cli.py: taught signs and lip words
_type_label = TyperOption.display_type_rich


def _no_bool_label(self: TyperOption, ctx: Any) -> str | None:
    """--help shows no "<bool>" after a flag: a flag takes no value."""
    return None if self.is_flag else _type_label(self, ctx)


TyperOption.display_type_rich = _no_bool_label  # type: ignore[method-assign]

URL_OPT = typer.Option(None, "--url", envvar="LINGUAFUSION_URL", help="Server URL; without it, run in-process.")
KEY_OPT = typer.Option(None, "--api-key", envvar="LINGUAFUSION_API_KEY", help="API key (sk_...).")
STATE_OPT = typer.Option(None, "--state-dir", envvar="LINGUAFUSION_STATE_DIR", help="Where keys and state live.")


def _fail(exc: LinguaFusionError) -> None:
    fail(exc)


def is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def _settings(state_dir: Path | None) -> Any:
    from .config import Settings

    s = Settings()
    if state_dir is not None:
        s.state_dir = state_dir
    return s


@app.command()
def serve(host: str = typer.Option("127.0.0.1", "--host"), port: int = typer.Option(8000, "--port"),
          no_auth: bool = typer.Option(False, "--no-auth", help="Development only: no API keys (loopback only)."),
          state_dir: Path | None = STATE_OPT, log_level: str = typer.Option("info", "--log-level"),
          chaos: bool = typer.Option(False, "--chaos", help="Allow fault injection (admin key) for experiments."),
          workers: int = typer.Option(1, "--workers", min=1, max=64,
                                      help="Stream worker processes sharing one model process (api/workers.py); "
                                           "1: everything in this process."),
          model_processes: int = typer.Option(1, "--model-processes", min=1, max=64,
                                              help="With --workers: model processes (each its own engine and share "
                                                   "of the GPU; worker i feeds model process i % M)."),
          cluster: bool = typer.Option(False, "--cluster", help="Run on Ray Serve: gateway and model replicas, "
                                                                 "state in Redis (docs/cluster.md)."),
          ray_address: str | None = typer.Option(None, "--ray-address", envvar="RAY_ADDRESS",
                                                 help="With --cluster: the Ray cluster (host:port); none starts "
                                                      "a local one."),
          gateways: int = typer.Option(2, "--gateways", min=1, max=64, help="With --cluster: gateway replicas."),
          model_replicas: int = typer.Option(1, "--model-replicas", min=1, max=64,
                                             help="With --cluster: model replicas (the minimum when autoscaling)."),
          max_model_replicas: int = typer.Option(0, "--max-model-replicas", min=0, max=256,
                                                 help="With --cluster: autoscale model replicas up to this many "
                                                      "(queue depth and SLO headroom); 0: a fixed count.")
          ) -> None:
    """Run the server (SQLite state, in-process cache, CPU models)."""
    from .api import create_app
    from .api.server import build_server, install_logging

    if no_auth and not is_loopback(host):
        usage(f"--no-auth may only bind to loopback, not {host}")
    settings = _settings(state_dir)
    settings.server.host, settings.server.port, settings.server.auth = host, port, not no_auth
    settings.server.chaos = chaos or settings.server.chaos
    install_logging(log_level)  # before the app is built: what it logs at start-up is masked too
    if cluster:
        from .cluster.deploy import ClusterSpec, run_cluster
        from .state.sqlite import SQLiteStore

        if workers > 1 or model_processes > 1 or settings.server.chaos:
            usage("--cluster runs its own processes: it takes neither --workers, --model-processes nor --chaos")
        if not settings.state.redis_url:
            usage("--cluster needs Redis for the shared stream log: set LINGUAFUSION_STATE__REDIS_URL")

        def ready() -> None:
            keys = SQLiteStore(settings.resolved_state_dir())  # gateways read the same key store
            _banner(keys, settings, host, port)
            keys.close()

        spec = ClusterSpec(gateways, model_replicas, max_model_replicas or None)
        run_cluster(settings, spec, address=ray_address, host=host, port=port, ready=ready)
        return
    if model_processes > workers:
        usage(f"--model-processes {model_processes} needs at least as many --workers (each feeds one)")
    if workers > 1:
        if settings.server.chaos:
            usage("--chaos needs a single process: fault injection is not sent to the model process (--workers 1)")
        from .api.workers import serve_sharded
        from .state.sqlite import SQLiteStore

        keys = SQLiteStore(settings.resolved_state_dir())
        _banner(keys, settings, host, port)
        keys.close()
        try:
            serve_sharded(settings, workers, log_level, model_processes)
        except OSError as exc:  # the port is taken, the host is not ours
            usage(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return
    app_ = create_app(settings)
    _banner(app_.state.store, settings, host, port)
    # connection cap, head timeout, WebSocket frame limit, masked logs, drain on SIGTERM (api/server.py)
    build_server(app_, settings, log_level=log_level).run()


def runnable() -> str:
    """How to run this command from the user's shell: ``linguafusion`` when that is on PATH and is this one,
    else its path (``make run`` installs it in .venv/bin, which is not on PATH)."""
    import shutil

    here = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("linguafusion")
    if found and here is not None and Path(found).resolve() == here:
        return "linguafusion"
    beside = Path(sys.executable).parent / "linguafusion"
    return str(beside) if beside.exists() else "linguafusion"


def _banner(store: Any, settings: Any, host: str, port: int) -> None:
    """Where the server is, where its state lives, and with auth on and no key yet, the command that makes one."""
    state = settings.resolved_state_dir()
    auth = settings.server.auth
    err.print(f"LinguaFusion on http://{host}:{port} (auth {'on' if auth else 'off'}); state directory: {state}",
              markup=False)
    if auth and not any(not k.revoked for k in store.list_keys()):
        err.print(f"no API key in {state} yet: create one with\n  {runnable()} keys create --admin --state-dir "
                  f"{state}", markup=False, style="yellow")
    err.print(f"API docs: http://{host}:{port}/docs", markup=False, style="dim")


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
    url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
) -> None:
    """Translate a file or text, through a server (--url) or in-process. Warnings go to stderr."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .sdk import LocalTranslator, MultimodalTranslator

    kind = _output_kind(file, text, as_json, fmt, target_modality, out)
    try:
        client: Any = MultimodalTranslator(api_key=api_key, base_url=url) if url else LocalTranslator()
        gid = client.upload_glossary(glossary) if glossary else None
        label = f"translating {file.name if file else 'text'} -> {to}"
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                      transient=True, disable=not err.is_terminal) as progress:
            progress.add_task(label, total=None)
            result = client.translate(str(file) if file else None, text=text, target_lang=to,
                                      source_lang=source_lang, source_modality=modality,
                                      target_modality=target_modality, enable_glossary=gid is not None,
                                      glossary_id=gid, vocabulary_id=vocabulary)
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
        write_out(out, render(result, kind))
    else:
        sys.stdout.write(render(result, kind))


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
    source_lang: str | None = typer.Option(None, "--from", help="Spoken language (detected from the file if omitted)."),
    slo: str = typer.Option("standard", "--slo", help="interactive | standard | batch"),
    realtime: bool = typer.Option(False, "--realtime", help="Pace the audio at real time."),
    chunk_ms: int = typer.Option(250, "--chunk-ms"),
    partials: bool = typer.Option(True, "--partials/--no-partials"),
    as_json: bool = typer.Option(False, "--json", help="One JSON event per line."),
    url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
    room: bool = typer.Option(False, "--room", help="Publish the stream as a room; prints its room_id and "
                              "listener_token (with --json: the ready event) for `linguafusion listen`."),
) -> None:
    """Play FILE as a live stream and print captions as they arrive."""
    import asyncio

    from .streamclient import play_file

    try:
        code = asyncio.run(play_file(file, targets=to, source_lang=source_lang, slo=slo, realtime=realtime,
                                     chunk_ms=chunk_ms, partials=partials, as_json=as_json, url=url,
                                     api_key=api_key, console=err, room=room))
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
    from .listenclient import listen_room

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

    try:
        if url:
            from .sdk import MultimodalTranslator

            caps = MultimodalTranslator(api_key=api_key, base_url=url).models()
        else:
            from .config import Settings
            from .models.registry import Registry

            reg = Registry(Settings())
            caps = {"models": reg.capabilities(), "pairs": reg.served_pairs(), "routes": reg.pair_routes()}
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


def _key_store(state_dir: Path | None, *, create: bool) -> Any:
    """The key store of ``--state-dir`` (or the default), named on stderr; list/revoke never create one."""
    from .state.sqlite import SQLiteStore

    directory = _settings(state_dir).resolved_state_dir()
    path = directory / "linguafusion.sqlite3"
    if not create and not path.exists():
        fail(InvalidParameter(f"no key store in {directory} (no {path.name} there): is --state-dir the folder the "
                              "server was started with? `linguafusion keys create --state-dir DIR` makes one"))
    err.print(f"key store: {path}", markup=False, style="dim")
    import sqlite3

    try:
        return SQLiteStore(directory)
    except (OSError, sqlite3.Error) as exc:  # a file named like the folder, no permission, a corrupt store
        fail(InvalidParameter(f"cannot open the key store in {directory}: {exc}; --state-dir must be a folder "
                              "you can write, holding the server's linguafusion.sqlite3",
                              details={"path": str(path)}))


@keys_app.command("create")
def keys_create(name: str = typer.Option("", "--name", help="A label for the key."),
                admin: bool = typer.Option(False, "--admin", help="Also allow key management (admin scope)."),
                state_dir: Path | None = STATE_OPT) -> None:
    """Create a key; the secret is printed once and stored only as a hash. Create it in the state directory the
    server runs with (--state-dir, or LINGUAFUSION_STATE_DIR), or the server will not know it."""
    store = _key_store(state_dir, create=True)
    secret, key = store.create_key(name, ("translate", "admin") if admin else ("translate",))
    store.close()
    sys.stdout.write(f"{secret}\n")
    err.print(f"created {key.key_id} (scopes: {','.join(key.scopes)}); the secret is not stored, keep it safe",
              markup=False)


@keys_app.command("list")
def keys_list(state_dir: Path | None = STATE_OPT) -> None:
    """List the keys of a state directory: id, name, scopes, active or revoked (never the secrets)."""
    store = _key_store(state_dir, create=False)
    for k in store.list_keys():
        sys.stdout.write(f"{k.key_id}\t{k.name}\t{','.join(k.scopes)}\t{'revoked' if k.revoked else 'active'}\n")
    store.close()


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key's id (key_...), as `keys list` prints it."),
                state_dir: Path | None = STATE_OPT) -> None:
    """Revoke a key: requests with it get 401 from then on."""
    store = _key_store(state_dir, create=False)
    try:
        store.revoke_key(key_id)
    except LinguaFusionError as exc:
        fail(exc)
    finally:
        store.close()
    err.print(f"revoked {key_id}", markup=False)


@bench_app.command("file")
def bench_file(
    file: Path = typer.Argument(..., help="Input file to translate repeatedly."),
    to: str = typer.Option("es", "--to"), source_lang: str | None = typer.Option(None, "--from"),
    target_modality: str = typer.Option("text", "--target-modality"),
    repeat: int = typer.Option(3, "--repeat"), json_out: Path | None = typer.Option(None, "--json"),
) -> None:
    """File latency in-process: cold (first) vs warm requests, per stage, real-time factor."""
    from .lab.benchfile import run_file_bench

    try:
        report = run_file_bench(file, to=to, source_lang=source_lang, target_modality=target_modality,
                                repeat=repeat)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    emit_report(report, json_out)


@bench_app.command("load")
def bench_load(
    url: str | None = typer.Option(None, "--url", envvar="LINGUAFUSION_URL", help="The server to load (required)."),
    api_key: str | None = KEY_OPT,
    streams: str = typer.Option("1,2,4", "--streams", help="Comma list of concurrent stream counts."),
    mix: Path | None = typer.Option(None, "--mix", help="YAML mix of stream kinds (docs/loadgen.md)."),
    duration: float = typer.Option(30.0, "--duration", help="Seconds of audio each stream plays."),
    knee: bool = typer.Option(False, "--knee", help="Binary-search the largest load that meets the SLO."),
    baseline: bool = typer.Option(False, "--baseline", help="Also run the per-stream baseline, report the ratio."),
    run_all: bool = typer.Option(False, "--all", help="Run every N even past the first that misses (overload study)."),
    seed: int = typer.Option(0, "--seed"),
    json_out: Path | None = typer.Option(None, "--json"), html_out: Path | None = typer.Option(None, "--html"),
) -> None:
    """Drive a live server with N concurrent streams paced at real time; SLO report per class."""
    from .lab.loadgen.mix import load_mix
    from .lab.loadgen.sweep import run_bench_load

    if not url:
        usage("bench load needs --url (or LINGUAFUSION_URL): it measures a running server")
    try:
        counts = [int(x) for x in streams.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        usage("--streams must be a comma list of positive integers")
    try:
        report = run_bench_load(url, api_key, load_mix(mix), mix, counts, duration, seed=seed, baseline=baseline,
                                knee=knee, console=err, run_all=run_all)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    if html_out is not None:
        from .lab.loadgen.html import write_load_html

        write_load_html(report, html_out)
    emit_report({k: v for k, v in report.items()}, json_out)


@bench_app.command("compare")
def bench_compare(a: Path = typer.Argument(...), b: Path = typer.Argument(...),
                  tolerance: float = typer.Option(0.10, "--tolerance"),
                  json_out: Path | None = typer.Option(None, "--json")) -> None:
    """Difference between two reports (bench or eval JSON); exit 1 when B regresses past the tolerance."""
    from .lab.loadgen.sweep import compare

    try:
        ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    except (OSError, ValueError) as exc:
        usage(f"cannot read the reports: {exc}")
    kinds = [r.get("schema") if isinstance(r, dict) else None for r in (ra, rb)]
    if None in kinds or kinds[0] != kinds[1]:
        usage(f"{a.name} and {b.name} are not reports of one kind ({kinds[0] or 'no schema'} vs "
              f"{kinds[1] or 'no schema'}): compare a bench or eval report with another of the same kind")
    res = compare(ra, rb, tolerance)
    if not res["compared"]:
        usage(f"{a.name} and {b.name} share no metric to compare")
    for row in res["rows"]:
        if row["change"]:
            flag = "  REGRESSION" if row in res["regressions"] else ""
            sys.stdout.write(f"{row['metric']}: {row['a']:g} -> {row['b']:g} ({row['change']:+.1%}){flag}\n")
    sys.stdout.write(f"{len(res['regressions'])} regression(s) over {res['compared']} shared metrics\n")
    if json_out:
        emit_report(res, json_out)
    raise typer.Exit(1 if res["regressions"] else 0)


@chaos_app.command("run")
def chaos_run(experiment: Path = typer.Argument(..., help="Experiment YAML (see examples/chaos/)."),
              json_out: Path | None = typer.Option(None, "--json"),
              html_out: Path | None = typer.Option(None, "--html")) -> None:
    """Run a load against a server this command starts, inject the experiment's faults, compare with a baseline."""
    from .lab.chaos.experiment import run_experiment

    try:
        report = run_experiment(experiment, err)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    if html_out is not None:
        from .lab.loadgen.html import write_load_html

        runs = {"runs": [report["faulted"]],
                **({"baseline": {"runs": [report["baseline"]]}} if "baseline" in report else {})}
        write_load_html({**{k: v for k, v in report.items() if k not in ("baseline", "faulted")}, **runs}, html_out)
    emit_report(report, json_out)


@app.command("eval")
def eval_cmd(
    set_dir: str = typer.Option("builtin", "--set", help="Test set folder (see docs/eval.md) or 'builtin'."),
    pair: str = typer.Option("en-es", "--pair", help="source-target, e.g. en-es"),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report here."),
    html_out: Path | None = typer.Option(None, "--html", help="Write an HTML report (plots beside it)."),
    degrade: str = typer.Option("", "--degrade", help="Comma list of studies: noise,dropout,blur,offset"),
    a: float = typer.Option(0.6, "--a", help="Weight of WER in the joint score BLEU - a*WER*100."),
    seed: int = typer.Option(0, "--seed"),
    make_set: Path | None = typer.Option(None, "--make-set", help="Only write the built-in set into this folder."),
    url: str | None = URL_OPT, api_key: str | None = KEY_OPT,
) -> None:
    """Quality (BLEU, chrF, WER/CER) and latency per path on a test set; optional degradation study."""
    from .lab.eval.cli import run_eval

    try:
        report = run_eval(set_dir=set_dir, pair=pair, html_out=html_out, degrade=degrade, a=a, seed=seed,
                          make_set=make_set, url=url, api_key=api_key, console=err)
    except LinguaFusionError as exc:
        _fail(exc)
        return
    emit_report(report, json_out)


def main() -> None:
    from typer.exceptions import TyperException  # typer's usage errors (its own click's ClickException) are these

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        code = app(standalone_mode=False)  # usage errors come back here, to be told in the documented form
    except TyperException as exc:  # an unknown option or command, a value out of range, a missing argument
        code = _exit_code(usage, exc.format_message() if hasattr(exc, "format_message") else str(exc))
    except LinguaFusionError as exc:  # a typed error that a command did not catch: still the documented form
        code = _exit_code(fail, exc)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def _exit_code(report: Any, what: Any) -> int:
    try:
        report(what)
    except typer.Exit as done:
        return int(done.exit_code)
    return 2


if __name__ == "__main__":
    main()
