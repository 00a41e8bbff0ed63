"""A GPU runner is built on its own thread (serving/gpu/deferred.py): the event loop serving every stream keeps
running while a model's runner loads, the first call waits in the scheduler and then gets its result, and a runner
that cannot be built fails its calls with a typed error instead of leaving them waiting.

The built runner here is a stand-in (a ContinuousRunner that answers at once): what is under test is the executor
and the deferral, not decoding (tests/service/test_gpu_engine_server.py runs the real engine through the same path)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from lingua_fusion.config import Settings
from lingua_fusion.errors import BackendError
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.gpu.deferred import DeferredRunner
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, CallContext

KEY = ModelKey.asr("en")


class Answering:
    """A ContinuousRunner that answers each clip with its length in samples."""

    def __init__(self) -> None:
        self.closed = False

    def room(self) -> int:
        return 64

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        out: list[Future[Any]] = []
        for p in payloads:
            f: Future[Any] = Future()
            f.set_result(AsrOutput(f"{len(p.audio)} samples", 0.9))
            out.append(f)
        return out

    def close(self) -> None:
        self.closed = True


def _executor(build: Any, clock: Any = None) -> tuple[Executor, list[DeferredRunner]]:
    made: list[DeferredRunner] = []

    def factory(key: ModelKey) -> DeferredRunner:
        made.append(DeferredRunner(build, str(key), **({"clock": clock} if clock else {})))
        return made[-1]

    settings = Settings()
    return Executor(None, settings, backends={"asr": factory}), made  # type: ignore[arg-type]


async def test_the_loop_runs_while_the_runner_builds_and_the_first_call_then_gets_its_result() -> None:
    release, building = threading.Event(), threading.Event()
    built = Answering()

    def build() -> Answering:
        building.set()
        if not release.wait(timeout=30):  # never hang the test
            raise TimeoutError("the test never released the build")
        return built

    executor, made = _executor(build)
    call = asyncio.create_task(executor.run(KEY, AsrInput(np.zeros(1600, np.float32)), CallContext(stream_id="s")))
    ticks = 0
    while not building.is_set() or ticks < 20:  # the loop goes round while build() is blocked on its thread
        await asyncio.sleep(0.01)
        ticks += 1
    assert not call.done() and made[0].built is None and made[0].room() == 0
    release.set()
    out = await asyncio.wait_for(call, timeout=10)
    assert out.text == "1600 samples" and made[0].built is built
    await executor.close()
    assert built.closed


async def test_a_runner_that_cannot_be_built_fails_its_calls_and_is_built_again_after_a_back_off() -> None:
    """The first build fails (a passing out-of-memory): calls fail at once with the reason, the executor does not
    wait on a runner that will never come; once the back-off has passed the next call starts a new build, which
    works."""
    attempts: list[int] = []
    now = [0.0]

    def build() -> Answering:
        attempts.append(1)
        if len(attempts) == 1:
            raise MemoryError("CUDA out of memory (the test's)")
        return Answering()

    executor, made = _executor(build, clock=lambda: now[0])
    ctx = CallContext(stream_id="s", tentative=True)  # no retries: the error comes back as it is
    clip = AsrInput(np.zeros(1600, np.float32))
    with pytest.raises(BackendError, match="could not start on the GPU engine: MemoryError"):
        await asyncio.wait_for(executor.run(KEY, clip, ctx), timeout=10)
    with pytest.raises(BackendError, match="MemoryError"):  # within the back-off: no new build
        await asyncio.wait_for(executor.run(KEY, clip, ctx), timeout=10)
    assert len(attempts) == 1 and made[0].built is None
    now[0] = 31.0  # past the first back-off (30 s)
    out = await asyncio.wait_for(executor.run(KEY, clip, ctx), timeout=10)
    assert out.text == "1600 samples" and len(attempts) == 2 and made[0].built is not None
    await executor.close()


def test_a_runner_built_after_close_is_closed_and_never_used() -> None:
    release = threading.Event()
    built = Answering()

    def build() -> Answering:
        release.wait(timeout=30)
        return built

    deferred = DeferredRunner(build, "asr:late")
    deferred.close()  # does not wait for the build
    release.set()
    assert deferred._thread is not None
    deferred._thread.join(timeout=30)
    assert built.closed and deferred.built is None


class Recording(Answering):
    """An Answering runner that keeps every clip it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        self.seen += [len(p.audio) for p in payloads]
        return super().submit(payloads, tentative)


async def test_work_whose_caller_is_cancelled_leaves_the_queue_and_never_runs() -> None:
    """A stream that ends (taken over by a resume, shed, its client gone) cancels its pending model calls: their
    queued items are withdrawn, so the runner spends no batch room on results nobody reads, and the calls of the
    streams still live run as before."""
    release = threading.Event()
    built = Recording()

    def build() -> Recording:
        if not release.wait(timeout=30):
            raise TimeoutError("the test never released the build")
        return built

    executor, _ = _executor(build)
    gone = [asyncio.create_task(executor.run(KEY, AsrInput(np.zeros(800 + i, np.float32)),
                                             CallContext(stream_id="old"))) for i in range(3)]
    live = asyncio.create_task(executor.run(KEY, AsrInput(np.zeros(1600, np.float32)), CallContext(stream_id="new")))
    for _ in range(100):  # all four queued behind the build
        if executor.depth(KEY) == 4:
            break
        await asyncio.sleep(0.01)
    assert executor.depth(KEY) == 4
    for t in gone:
        t.cancel()
    await asyncio.gather(*gone, return_exceptions=True)
    assert executor.depth(KEY) == 1
    release.set()
    out = await asyncio.wait_for(live, timeout=10)
    assert out.text == "1600 samples" and built.seen == [1600]
    await executor.close()


FACTORY_IN_A_FRESH_PROCESS = """
import sys
from lingua_fusion.config import Settings
from lingua_fusion.serving.gpu import deferred
from lingua_fusion.serving.gpu.server import engine_backends
from lingua_fusion.serving.keys import ModelKey

class Registry:
    def decode_mt_with(self, serve): pass
    def asr_torch(self, lang): raise RuntimeError("no weights in this test")

assert "torch" not in sys.modules
asr = engine_backends(Registry(), Settings(models={"engine": "continuous", "device": "cpu"}))["asr"]
with deferred._BUILDS:  # the build thread waits here: whatever is imported now, the factory's caller imported
    runner = asr(ModelKey.asr("en"))
    print("torch imported by the caller" if "torch" in sys.modules else "torch not imported by the caller")
    runner.close()
"""


def test_the_engine_factory_leaves_importing_torch_to_the_build_thread() -> None:
    """The ASR factory runs on the event loop (a language's first stream asks admission for its runner), and the
    first import of torch holds the loop for a second or more (1.0-1.9 s measured on a live server: every stream
    and /healthz stalled): the factory hands it to the build thread with the rest of the build."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FACTORY_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch not imported by the caller"


VAD_FACTORY_IN_A_FRESH_PROCESS = """
import sys
from lingua_fusion.config import Settings
from lingua_fusion.serving.gpu.server import engine_backends
from lingua_fusion.serving.keys import ModelKey

class Registry:
    def decode_mt_with(self, serve): pass

assert "torch" not in sys.modules
vad = engine_backends(Registry(), Settings(models={"engine": "continuous", "device": "cuda"}))["vad"]
runner = vad(ModelKey.parse("vad"))
print("torch imported by the caller" if "torch" in sys.modules else "torch not imported by the caller")
try:
    runner([])  # the first call builds it (here, with no GPU, that fails: on the caller's worker thread, not before)
except Exception as exc:
    print("built at the first call:", type(exc).__name__)
"""


def test_the_gpu_vad_factory_leaves_importing_torch_to_the_first_call() -> None:
    """On CUDA the VAD lane's runner is asked for on the event loop at a stream's first VAD call; building it there
    imported torch (and, with Silero, loaded its weights) on the loop. The factory now returns a runner built at its
    first call, which the executor makes on a worker thread."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", VAD_FACTORY_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "torch not imported by the caller" and lines[1].startswith("built at the first call"), lines
