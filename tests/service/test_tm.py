"""The translation memory: keyed by (API key, normalised segment, route, glossary version), local LRU then Redis,
never a translation made with another glossary or for another key; with real Apertium through the file path and a
real Redis shared tier."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from conftest import REDIS, needs_redis

from lingua_fusion.config import Settings
from lingua_fusion.files import FileRequest, FileTranslator
from lingua_fusion.glossary import Term
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.tm.key import entry_key, glossary_version, normalise
from lingua_fusion.tm.lru import LRU
from lingua_fusion.tm.memory import TranslationMemory
from lingua_fusion.tm.shared import SharedTier


class CountingMT:
    """A stand-in engine for the unit cases: upper-cases, counts the segments it was given."""

    def __init__(self) -> None:
        self.segments: list[str] = []

    def __call__(self, texts: list[str]) -> list[str]:
        self.segments += texts
        return [t.upper() for t in texts]


def memory(clock: list[float], **kw: int) -> TranslationMemory:
    lru = LRU(kw.get("entries", 100), kw.get("bytes", 1_000_000), ttl_s=60.0)
    return TranslationMemory(lru, clock=lambda: clock[0])


def test_a_repeated_segment_is_translated_once_and_whitespace_does_not_matter() -> None:
    clock, mt = [0.0], CountingMT()
    tm = memory(clock)
    out1, _ = tm.translate("r", ["Hello  world", "Hello world"], [(), ()], mt)
    out2, _ = tm.translate("r", [" Hello world "], [()], mt)
    assert out1 == ["HELLO  WORLD", "HELLO  WORLD"] and out2 == ["HELLO  WORLD"]
    assert mt.segments == ["Hello  world"]  # one MT call for three asks
    assert (tm.stats.hits_local, tm.stats.misses) == (1, 2)  # the duplicate inside a batch counts as a miss
    assert normalise(" a\n b\t") == "a b"


def test_never_a_translation_made_with_another_glossary_or_route() -> None:
    clock, mt = [0.0], CountingMT()
    tm = memory(clock)
    bank_a = [Term("bank", "orilla")]
    bank_b = [Term("bank", "banco")]
    a, used_a = tm.translate("r", ["the bank"], [bank_a], mt)
    b, used_b = tm.translate("r", ["the bank"], [bank_b], mt)
    none, _ = tm.translate("r", ["the bank"], [()], mt)
    other_route, _ = tm.translate("r2", ["the bank"], [bank_a], mt)
    assert a == ["THE orilla"] and b == ["THE banco"] and none == ["THE BANK"]
    assert used_a == [[bank_a[0]]] and used_b == [[bank_b[0]]]
    assert len(mt.segments) == 4  # four keys, four MT calls: nothing crossed over
    again, used = tm.translate("r", ["the bank"], [bank_a], mt)
    assert again == ["THE orilla"] and used == [[bank_a[0]]] and len(mt.segments) == 4
    # the version is the glossary's content: order-free, any changed target is another version
    assert glossary_version(bank_a + bank_b) == glossary_version(bank_b + bank_a)
    assert glossary_version(bank_a) != glossary_version(bank_b) != glossary_version([])
    assert glossary_version([], [Term("Acme", "Acme")]) != glossary_version([Term("Acme", "Acme")])
    assert entry_key("x", "r", "none") != entry_key("x", "r2", "none")


def test_entries_expire_and_the_size_bounds_evict_the_least_recently_used() -> None:
    clock, mt = [0.0], CountingMT()
    tm = memory(clock, entries=2)
    tm.translate("r", ["one", "two"], [(), ()], mt)
    tm.translate("r", ["one"], [()], mt)  # "one" is now the most recent
    tm.translate("r", ["three"], [()], mt)  # pushes out "two"
    assert tm.local.evictions == 1 and len(tm.local) == 2
    tm.translate("r", ["one", "two"], [(), ()], mt)
    assert mt.segments == ["one", "two", "three", "two"]
    clock[0] = 61.0  # past the TTL: translated again
    tm.translate("r", ["one"], [()], mt)
    assert mt.segments[-1] == "one" and tm.local.expirations >= 1
    small = LRU(100, max_bytes=200, ttl_s=60)
    small.put("k1", "x" * 100, (), 0.0)
    small.put("k2", "y" * 100, (), 0.0)
    assert len(small) == 1 and small.get("k2", 0.0) is not None and small.bytes <= 200


def test_long_and_empty_segments_are_translated_but_not_kept() -> None:
    clock, mt = [0.0], CountingMT()
    tm = TranslationMemory(LRU(10, 10_000, 60), max_segment_chars=10, clock=lambda: clock[0])
    tm.translate("r", ["a long sentence here", ""], [(), ()], mt)
    tm.translate("r", ["a long sentence here"], [()], mt)
    assert mt.segments.count("a long sentence here") == 2 and len(tm.local) == 0 and tm.stats.bypassed == 3


@pytest.fixture
def engine(tmp_path) -> Iterator[FileTranslator]:  # type: ignore[no-untyped-def]
    """The file path with real Apertium and its translation memory (on, by default), in a fresh state directory."""
    s = Settings()
    s.state_dir = tmp_path
    translator = FileTranslator(s)
    assert translator.registry.translation_memory() is not None
    yield translator
    translator.close()


def test_real_apertium_file_path_uses_the_memory_and_keeps_glossaries_apart(engine: FileTranslator) -> None:
    tm = engine.registry.translation_memory()

    def run(glossary: list[Term]) -> str:
        req = FileRequest(text="I went to the bank.", source_modality="text", target_lang="es",
                          source_lang="en", glossary=glossary)
        return engine.translate(req).text

    plain = run([])
    hits = tm.stats.hits_local
    assert run([]) == plain and tm.stats.hits_local == hits + 1  # the same text again: from the memory
    with_term = run([Term("bank", "orilla")])
    assert "orilla" in with_term and "orilla" not in plain  # another glossary: never the cached one
    assert run([]) == plain


def test_one_key_never_hits_or_times_another_keys_cached_translation(engine: FileTranslator) -> None:
    """The memory is per API key: a sentence key A had translated is a miss for key B (shared, B's fast answer
    would tell it what A translated), a hit for A again; on the file path and on the stream engine's MT runner."""
    from lingua_fusion.serving.executor import Executor
    from lingua_fusion.serving.ports import CallContext, MtInput

    tm = engine.registry.translation_memory()

    def run(key_id: str, text: str) -> str:
        req = FileRequest(text=text, source_modality="text", target_lang="es", source_lang="en", scope=key_id)
        return engine.translate(req).text

    a = run("key_a", "The river bank was quiet this morning.")
    hits, misses = tm.stats.hits_local, tm.stats.misses
    assert run("key_b", "The river bank was quiet this morning.") == a
    assert (tm.stats.hits_local, tm.stats.misses) == (hits, misses + 1)  # B: translated, not served A's
    assert run("key_a", "The river bank was quiet this morning.") == a and tm.stats.hits_local == hits + 1

    async def stream_mt(key_id: str) -> str:  # the stream engine: the executor stamps each MT item with its key
        ex = Executor(engine.registry, engine.settings)
        try:
            return str(await ex.run(ModelKey.mt("en", "es"), MtInput("The new office opens in May."),
                                    CallContext(f"st_{key_id}", key_id=key_id)))
        finally:
            await ex.close()

    first = asyncio.run(stream_mt("key_a"))
    hits, misses = tm.stats.hits_local, tm.stats.misses
    assert asyncio.run(stream_mt("key_b")) == first and tm.stats.misses == misses + 1
    assert asyncio.run(stream_mt("key_a")) == first and tm.stats.hits_local == hits + 1

@needs_redis
def test_the_shared_tier_serves_another_server_and_survives_redis_loss() -> None:
    assert REDIS is not None
    mt = CountingMT()
    first = TranslationMemory(LRU(100, 100_000, 60), SharedTier(REDIS, 60))
    second = TranslationMemory(LRU(100, 100_000, 60), SharedTier(REDIS, 60))  # another process's memory
    route = "test-shared-" + str(id(mt))
    first.translate(route, ["the same slide"], [()], mt)
    out, _ = second.translate(route, ["the same slide"], [()], mt)
    assert out == ["THE SAME SLIDE"] and mt.segments == ["the same slide"]
    assert second.stats.hits_shared == 1
    out, _ = second.translate(route, ["the same slide"], [[Term("slide", "diapositiva")]], mt)
    assert out == ["THE SAME diapositiva"]  # another glossary: not the shared entry
    dead = TranslationMemory(LRU(100, 100_000, 60), SharedTier("redis://127.0.0.1:1/0", 60, timeout_s=0.2))
    out, _ = dead.translate(route, ["no redis"], [()], mt)
    assert out == ["NO REDIS"] and not dead.shared.available()  # type: ignore[union-attr]
    first.close()
    second.close()
    dead.close()
