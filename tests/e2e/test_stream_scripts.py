"""A live stream's Chinese in the script its tags ask for, on a real server: Whisper base hears Mandarin (espeak-ng's
pinyin voice), the tiny LLM writes Chinese captions; zh is Simplified, zh-TW Traditional, and the events say which."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from conftest import BIN, Server, espeak_wav, piper_wav

from lingua_fusion import MultimodalTranslator
from lingua_fusion.config import LimitSettings
from lingua_fusion.media import decode_audio
from lingua_fusion.models.transcript_guard import to_script

PINYIN = "jin1 tian1 tian1 qi4 hen3 hao3. qing3 wen4 huo3 che1 zhan4 zai4 na3 li3?"  # espeak's Mandarin voice
HAN = re.compile(r"[\u4e00-\u9fff]")


async def _finals(t: MultimodalTranslator, source: str, targets: list[str], *, audio: bytes | None = None,
                  text: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with t.stream(targets, source_lang=source, partials=False,
                        inputs=["audio"] if audio is not None else ["text"]) as s:
        if audio is not None:
            await s.send_audio(audio, ts=0.0)
        if text is not None:
            await s.send_text(text, ts=0.0)
        await s.end()
        return s.ready, [ev.model_dump() async for ev in s if ev.type == "final"]


# espeak's robotic Mandarin, as it is and with gaps between words: Whisper base (int8) hears Han characters in one
# and a repetition loop in another, and which one depends on the CPU's int8 kernels (a machine without AVX-512 heard
# only a cut loop in the first). The test is of the scripts, so it streams the first rendering that this server's
# own file route hears as Mandarin.
RENDERINGS: list[tuple[str, ...]] = [(), ("-g", "5"), ("-s", "150", "-g", "5")]


def _heard_as_mandarin(server: Server, key: str) -> bytes:
    import httpx

    heard = []
    for args in RENDERINGS:
        wav = espeak_wav(PINYIN, "cmn-latn-pinyin", *args)
        r = httpx.post(server.url + "/v1/translate", files={"file": ("zh.wav", wav, "audio/wav")},
                       data={"source_lang": "zh", "target_lang": "zh"}, headers={"Authorization": f"Bearer {key}"},
                       timeout=120)
        assert r.status_code == 200, r.text
        if HAN.search(r.json()["text"]):
            return wav
        heard.append((args, r.json()["text"]))
    raise AssertionError(f"no rendering of the Mandarin was heard as Han characters: {heard}")


async def test_a_stream_transcribes_mandarin_in_the_script_its_source_tag_asks_for(server: Server) -> None:
    key = server.key()
    wav = await asyncio.to_thread(_heard_as_mandarin, server, key)
    audio, _ = decode_audio(wav, LimitSettings())
    pcm = (audio.clip(-1, 1) * 32767).astype("<i2").tobytes()
    t = MultimodalTranslator(api_key=key, base_url=server.url)
    (ready_tw, tw), (ready_cn, cn) = await asyncio.gather(_finals(t, "zh-TW", ["zh-TW"], audio=pcm),
                                                          _finals(t, "zh", ["zh"], audio=pcm))
    assert ready_tw["scripts"] == {"source": "zh-Hant (Traditional)", "zh": "zh-Hant (Traditional)"}
    assert ready_cn["scripts"] == {"source": "zh-Hans (Simplified)", "zh": "zh-Hans (Simplified)"}
    heard_tw, heard_cn = "".join(f["source_text"] for f in tw), "".join(f["source_text"] for f in cn)
    # Mandarin heard (robotic: words may be wrong, the script is what is checked)
    assert HAN.search(heard_tw) and HAN.search(heard_cn), json.dumps(tw + cn, ensure_ascii=False)
    assert to_script(heard_tw, "Hant") == heard_tw and to_script(heard_cn, "Hans") == heard_cn
    assert to_script(heard_tw, "Hans") != heard_tw  # there were characters to convert: not a vacuous check
    for f in tw + cn:  # a transcription: the caption is the transcript, and says its script
        assert f["translations"]["zh"] == f["source_text"] and f["scripts"] == (ready_tw if f in tw
                                                                                 else ready_cn)["scripts"]


async def test_a_stream_captions_chinese_in_the_script_its_target_tag_asks_for(server: Server) -> None:
    t = MultimodalTranslator(api_key=server.key(), base_url=server.url)
    sentence = "The museum is closed on Mondays."
    (ready_tw, tw), (_, cn) = await asyncio.gather(_finals(t, "en", ["zh-TW", "es"], text=sentence),
                                                   _finals(t, "en", ["zh"], text=sentence))
    assert ready_tw["targets"] == ["zh", "es"] and ready_tw["scripts"] == {"zh": "zh-Hant (Traditional)"}
    traditional, simplified = tw[0]["translations"]["zh"], cn[0]["translations"]["zh"]
    assert traditional == to_script(simplified, "Hant") and traditional != simplified  # 博物館 / 博物馆
    assert tw[0]["text"] == traditional and "museo" in tw[0]["translations"]["es"].lower()
    assert tw[0]["scripts"] == {"zh": "zh-Hant (Traditional)"} and cn[0]["scripts"] == {"zh": "zh-Hans (Simplified)"}


def test_the_cli_streams_to_the_tag_as_given(server: Server, tmp_path: Path) -> None:
    wav = tmp_path / "museum.wav"
    wav.write_bytes(piper_wav("The museum is closed on Mondays."))
    p = subprocess.run([str(BIN), "stream", str(wav), "--to", "zh-TW", "--from", "en", "--json", "--url", server.url,
                        "--api-key", server.key()], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    finals = [e for e in map(json.loads, p.stdout.splitlines()) if e["type"] == "final"]
    assert finals and all(f["scripts"] == {"zh": "zh-Hant (Traditional)"} for f in finals)  # not normalised to zh
    assert all(to_script(f["text"], "Hant") == f["text"] for f in finals) and HAN.search(finals[0]["text"])
