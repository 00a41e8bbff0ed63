"""The mediapipe worker: a standalone script (stdlib, numpy, mediapipe 0.10.21) run by the interpreter of the
``.venv-vision`` environment, so that mediapipe's numpy<2 and heavy dependencies stay out of the server's.

It imports nothing from lingua_fusion. ``extractor.MediapipeExtractor`` starts it and speaks a framed binary
protocol over its stdin / stdout; one request at a time, one response per request:

    frame   = header json payload
    header  = struct "<4sIII": magic b"LFV1", request id, len(json), len(payload)

Requests (json): ``{"op": "hello"}``; ``{"op": "extract", "session": str, "parts": ["hands", "pose", "lips"],
"frames": [{"t": float, "w": int, "h": int}, ...]}`` with the frames' RGB bytes (h x w x 3 uint8 each, in order)
as the payload; ``{"op": "close_session", "session": str}``; ``{"op": "quit"}``.

Responses (json): ``{"ok": true, ...}`` or ``{"ok": false, "error": str}``. For extract: ``{"ok": true, "frames":
[{"hands": [left, right], "pose": bool, "lips": bool}], "ms": {"hands": f, "pose": f, "lips": f}}`` (milliseconds
spent per part over the request) and the payload float32 N x POINTS x 2: left hand (21 points), right hand (21),
pose (33), lips (40, in LIP_INDICES order).

Coordinates are pixels divided by the frame's longer side. Hands: mediapipe labels handedness as if the image were
mirrored (a selfie camera); ordinary video is not, so the labels are swapped here: "left" is the signer's left hand.
Each session (a stream, a file) keeps its own trackers (mediapipe's video mode follows a hand from frame to frame);
at most MAX_SESSIONS are kept, the least recently used closed first.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import IO, Any, TypedDict

import numpy as np

MAGIC = b"LFV1"
HEADER = struct.Struct("<4sIII")
MAX_JSON = 1 << 20
MAX_PAYLOAD = 256 << 20
MAX_SESSIONS = 8
POINTS = 21 + 21 + 33 + 40
LIP_INDICES = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 185, 40, 39, 37, 0, 267, 269, 270, 409, 78, 95,
               88, 178, 87, 14, 317, 402, 318, 324, 308, 191, 80, 81, 82, 13, 312, 311, 310, 415)


class FrameFlags(TypedDict):
    """What was found in one frame: each hand (left, right), the pose, the lips."""

    hands: list[bool]
    pose: bool
    lips: bool


class Session:
    """mediapipe's solutions for one video, made on first use of each part."""

    def __init__(self, static: bool) -> None:
        self.static = static
        self.solutions: dict[str, Any] = {}

    def get(self, part: str) -> Any:
        if part not in self.solutions:
            import mediapipe as mp

            s = mp.solutions
            if part == "hands":
                self.solutions[part] = s.hands.Hands(static_image_mode=self.static, max_num_hands=2,
                                                     model_complexity=1, min_detection_confidence=0.5)
            elif part == "pose":
                self.solutions[part] = s.pose.Pose(static_image_mode=self.static, model_complexity=1)
            elif part == "lips":
                self.solutions[part] = s.face_mesh.FaceMesh(static_image_mode=self.static, max_num_faces=1,
                                                            refine_landmarks=False)
            else:
                raise ValueError(f"unknown part {part!r}")
        return self.solutions[part]

    def close(self) -> None:
        for sol in self.solutions.values():
            sol.close()
        self.solutions.clear()


def _xy(landmarks: Any, w: int, h: int, indices: Any = None) -> np.ndarray:
    side = float(max(w, h))
    pts = landmarks.landmark
    idx = range(len(pts)) if indices is None else indices
    return np.array([[pts[i].x * w / side, pts[i].y * h / side] for i in idx], np.float32)


def extract(session: Session, parts: list[str], meta: list[dict[str, Any]], payload: bytes
            ) -> tuple[dict[str, object], bytes]:
    out = np.zeros((len(meta), POINTS, 2), np.float32)
    flags = []
    ms = {p: 0.0 for p in parts}
    offset = 0
    for i, m in enumerate(meta):
        w, h = int(m["w"]), int(m["h"])
        n = w * h * 3
        if w <= 0 or h <= 0 or offset + n > len(payload):
            raise ValueError(f"frame {i}: {w}x{h} does not fit the payload")
        rgb = np.frombuffer(payload, np.uint8, n, offset).reshape(h, w, 3)
        offset += n
        flag: FrameFlags = {"hands": [False, False], "pose": False, "lips": False}
        if "hands" in parts:
            t0 = time.perf_counter()
            res = session.get("hands").process(rgb)
            ms["hands"] += (time.perf_counter() - t0) * 1000
            for lm, handed in zip(res.multi_hand_landmarks or [], res.multi_handedness or [], strict=False):
                label = handed.classification[0].label  # "Left" / "Right" as if mirrored: swap
                slot = 1 if label == "Left" else 0
                if not flag["hands"][slot]:
                    out[i, slot * 21:(slot + 1) * 21] = _xy(lm, w, h)
                    flag["hands"][slot] = True
        if "pose" in parts:
            t0 = time.perf_counter()
            res = session.get("pose").process(rgb)
            ms["pose"] += (time.perf_counter() - t0) * 1000
            if res.pose_landmarks is not None:
                out[i, 42:75] = _xy(res.pose_landmarks, w, h)
                flag["pose"] = True
        if "lips" in parts:
            t0 = time.perf_counter()
            res = session.get("lips").process(rgb)
            ms["lips"] += (time.perf_counter() - t0) * 1000
            if res.multi_face_landmarks:
                out[i, 75:] = _xy(res.multi_face_landmarks[0], w, h, LIP_INDICES)
                flag["lips"] = True
        flags.append(flag)
    return {"ok": True, "frames": flags, "ms": {k: round(v, 3) for k, v in ms.items()}}, out.tobytes()


def read_exact(stream: IO[bytes], n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def send(out: IO[bytes], rid: int, body: Mapping[str, object], payload: bytes = b"") -> None:
    raw = json.dumps(body).encode()
    out.write(HEADER.pack(MAGIC, rid, len(raw), len(payload)) + raw + payload)
    out.flush()


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    sessions: OrderedDict[tuple[str, bool], Session] = OrderedDict()
    while True:
        try:
            magic, rid, jlen, plen = HEADER.unpack(read_exact(inp, HEADER.size))
        except EOFError:
            return
        if magic != MAGIC or jlen > MAX_JSON or plen > MAX_PAYLOAD:
            send(out, 0, {"ok": False, "error": "bad frame header"})
            return  # the stream is out of step: the client restarts us
        req = json.loads(read_exact(inp, jlen))
        payload = read_exact(inp, plen)
        op = req.get("op")
        try:
            if op == "hello":
                import mediapipe as mp

                send(out, rid, {"ok": True, "mediapipe": mp.__version__, "numpy": np.__version__})
            elif op == "extract":
                key = (str(req.get("session", "")), bool(req.get("static", False)))
                if key not in sessions:
                    sessions[key] = Session(key[1])
                    while len(sessions) > MAX_SESSIONS:
                        sessions.popitem(last=False)[1].close()
                sessions.move_to_end(key)
                body, data = extract(sessions[key], list(req["parts"]), list(req["frames"]), payload)
                send(out, rid, body, data)
            elif op == "close_session":
                for k in [k for k in sessions if k[0] == req.get("session")]:
                    sessions.pop(k).close()
                send(out, rid, {"ok": True})
            elif op == "quit":
                send(out, rid, {"ok": True})
                return
            else:
                send(out, rid, {"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # reported to the client, which raises BackendError; the worker goes on
            send(out, rid, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    # the protocol gets its own copy of stdout; file descriptor 1 (and sys.stdout) then point at stderr, so that
    # nothing a library prints, from Python or from C, can fall into the protocol stream
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, protocol_out)
