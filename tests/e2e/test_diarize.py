"""Speaker diarization of files with the real voice encoder (issue 32): a two-voice dialogue through
``linguafusion translate FILE --to es --json --diarize`` finds both speakers with time-weighted agreement of at
least 90% (the issue's own check); the REST API's captions name the speakers; the OpenAI route answers
``diarized_json`` in OpenAI's shape; bad values are typed 4xx errors and the CLI's ``error [code]`` exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from conftest import BIN, Server

from lingua_fusion.lab.diarize.der import score
from lingua_fusion.lab.diarize.dialogue import Dialogue, build, hypothesis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
# sentences of their own (bench/diarize.py uses others), in two voices: Piper's joe and espeak-ng's en+f3
LINES = [("joe", "Did you manage to book the train tickets for Monday morning?"),
         ("en+f3", "Yes, two seats on the eight o'clock train from the central station."),
         ("joe", "Great. Shall we meet at the platform or in the cafe near the entrance?"),
         ("en+f3", "The cafe is better, we can have breakfast before we leave."),
         ("joe", "Perfect, I will bring the documents for the client meeting.")]


@pytest.fixture(scope="module")
def dialogue(tmp_path_factory: pytest.TempPathFactory) -> tuple[Dialogue, Path]:
    d = build(LINES, pause_s=0.5)
    path = tmp_path_factory.mktemp("diarize") / "dialogue.wav"
    path.write_bytes(d.wav)
    return d, path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=280)


def test_cli_finds_both_speakers_of_a_dialogue(dialogue: tuple[Dialogue, Path]) -> None:
    d, path = dialogue
    p = cli("translate", str(path), "--to", "es", "--json", "--diarize")
    assert p.returncode == 0, p.stderr
    segments = json.loads(p.stdout)["segments"]
    s = score(d.turns, hypothesis(segments))
    assert s.speakers_found == 2 and s.agreement >= 0.9, (s, segments)
    assert segments[0]["speaker"] == "S1" and all(0 <= g["speaker_confidence"] <= 1 for g in segments)
    assert all(g["text"] for g in segments)  # translated, speaker by speaker


def test_cli_refuses_bad_speaker_values(dialogue: tuple[Dialogue, Path]) -> None:
    _d, path = dialogue
    p = cli("translate", str(path), "--to", "es", "--diarize", "--max-speakers", "0")
    assert p.returncode == 2 and "error [invalid_parameter]: " in p.stderr and "--max-speakers" in p.stderr
    p = cli("translate", "--text", "Hello there.", "--from", "en", "--to", "es", "--diarize")
    assert p.returncode == 2 and "error [invalid_parameter]: " in p.stderr and "Traceback" not in p.stderr


def test_rest_captions_name_the_speakers_and_bad_values_are_400(server: Server,
                                                                 dialogue: tuple[Dialogue, Path]) -> None:
    _d, path = dialogue
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    r = httpx.post(server.url + "/v1/translate", headers=headers, timeout=280,
                   data={"target_lang": "es", "source_lang": "en", "diarize": "true", "output_format": "vtt"},
                   files={"file": ("dialogue.wav", path.read_bytes(), "audio/wav")})
    assert r.status_code == 200, r.text
    assert "<v S1>" in r.text and "<v S2>" in r.text
    for fields, field in [({"diarize": "ture"}, "diarize"), ({"diarize": "true", "max_speakers": "many"},
                                                             "max_speakers"),
                          ({"diarize": "true", "max_speakers": "50"}, "max_speakers")]:
        r = httpx.post(server.url + "/v1/translate", headers=headers, timeout=60,
                       data={"target_lang": "es", **fields}, files={"file": ("d.wav", path.read_bytes())})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", r.text
        assert r.json()["error"]["details"]["field"] == field


def test_openai_diarized_json_in_openais_shape(server: Server, dialogue: tuple[Dialogue, Path]) -> None:
    d, path = dialogue
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.admin_key, max_retries=0, timeout=280)
    result = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize", file=path.open("rb"),
                                                response_format="diarized_json")
    assert type(result).__name__ == "TranscriptionDiarized", type(result)
    segs = result.segments
    assert {s.speaker for s in segs} == {"A", "B"} and segs[0].speaker == "A"
    assert all(s.type == "transcript.text.segment" and s.start < s.end and s.text for s in segs)
    assert "train" in result.text.lower() and result.duration == pytest.approx(d.duration, abs=0.2)
