"""The LLM worker process: ``python -m lingua_fusion.models.llm_worker --gguf PATH --threads N``.

Started and supervised by ``mt_llm.GemmaMT`` (supervise/process.py); llama.cpp lives here and nowhere else, so a
crash in it costs the batch in flight, never the server. Frames are supervise/wire.py's with magic ``LFL1``:

    {"op": "hello"}                                   -> {"ok": true, "llama_cpp": version, "system_info": str}
    {"op": "translate", "texts": [...], "source": s, "target": t}  -> {"ok": true, "texts": [...]}
    {"op": "quit"}                                    -> {"ok": true}, then exits

An error the model raises is answered ``{"ok": false, "error": ...}`` and the worker goes on; the end of stdin
(the server went away) ends it.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import IO, Any

from ..supervise import wire
from .mt_llm import MAGIC, GemmaLlama

HEADER = struct.Struct(wire.HEADER_FORMAT)


def answer(model: GemmaLlama, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "hello":
        import llama_cpp

        info = llama_cpp.llama_print_system_info()
        return {"ok": True, "llama_cpp": llama_cpp.__version__,
                "system_info": info.decode() if isinstance(info, bytes) else str(info)}
    if op == "translate":
        texts = [str(t) for t in req.get("texts", [])]
        return {"ok": True, "texts": model.translate(texts, str(req.get("source")), str(req.get("target")))}
    return {"ok": False, "error": f"unknown op {op!r}"}


def serve(model: GemmaLlama, inp: IO[bytes], out: IO[bytes]) -> None:
    while True:
        try:
            magic, rid, jlen, plen = HEADER.unpack(wire.read_exact(inp, HEADER.size))
        except EOFError:
            return
        if magic != MAGIC or jlen > wire.MAX_JSON or plen > wire.MAX_PAYLOAD:
            return  # out of step: exit, and the supervisor restarts us
        req = json.loads(wire.read_exact(inp, jlen))
        wire.read_exact(inp, plen)
        if req.get("op") == "quit":
            wire.send(out, HEADER, MAGIC, rid, {"ok": True})
            return
        try:
            body = answer(model, req)
        except Exception as exc:  # reported to the client, which raises BackendError; the worker goes on
            body = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        wire.send(out, HEADER, MAGIC, rid, body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    out = wire.protocol_stdout()
    serve(GemmaLlama(args.gguf, threads=args.threads), sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
