"""Rooms churn: the cost of one ``POST /v1/rooms`` while one key creates and deletes rooms over and over (issue 29:
3,400 of them made each create scan every room kept, 9 -> 70 ms). In-process ``RoomService`` on the in-process
directory, no server: what is measured is the directory's work per create, not HTTP.

    .venv/bin/python bench/rooms_churn.py --rooms 3400   # also writes bench/results/rooms_churn.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from lingua_fusion.rooms.bus import LocalRoomBus
from lingua_fusion.rooms.directory import LocalRoomDirectory
from lingua_fusion.rooms.service import RoomService


async def churn(n: int) -> dict[str, float]:
    rooms = RoomService(LocalRoomBus(), LocalRoomDirectory(), check_pair=lambda s, t: None,
                        low_confidence=lambda s, t: False)
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        room, _token = await rooms.create("key_attacker", "en")
        times.append((time.perf_counter() - t0) * 1000)
        await rooms.end(room.room_id, "key_attacker")
    await rooms.close()
    head, tail = times[:100], times[-100:]
    return {"rooms": n, "first_100_median_ms": round(statistics.median(head), 4),
            "last_100_median_ms": round(statistics.median(tail), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rooms", type=int, default=3400)
    ap.add_argument("--json", type=Path, default=Path("bench/results/rooms_churn.json"))
    args = ap.parse_args()
    out = asyncio.run(churn(args.rooms))
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
