"""The NEFF and HLO stores in one process: hits, verification, corruption, I/O errors, stats."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import pathlib
import socket
import time

import pytest
from iree_add import ADD_MLIR, CONFIG, build

from torch_neuronx.cache import keys, layout, locks, maintenance, stats, store
from torch_neuronx.format import neff


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory) -> bytes:
    """The tiny module compiled once by the real compiler."""
    return (build(tmp_path_factory.mktemp("iree")) / "add.vmfb").read_bytes()


@pytest.fixture
def dirs(tmp_path, monkeypatch) -> tuple[pathlib.Path, pathlib.Path]:
    root, local = tmp_path / "neff_cache", tmp_path / "local_cache"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(root))
    monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", str(local))
    monkeypatch.setenv("TORCH_NEURONX_HLO_CACHE_DIR", str(tmp_path / "hlo_cache"))
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    return root, local


class Compiler:
    """A compile_fn that wraps the prebuilt module and counts its calls."""

    def __init__(self, vmfb: bytes, key: keys.CacheKey):
        self.vmfb, self.key, self.calls = vmfb, key, 0

    def __call__(self) -> bytes:
        self.calls += 1
        return neff.encode(self.vmfb, target="cpu", compiler_version="test", key=self.key.digest)


def _key(version: str = "3.13.0", graph_id: str = "add") -> keys.CacheKey:
    return keys.neff_key(ADD_MLIR, CONFIG, version, graph_id=graph_id)


def test_cold_miss_compiles_then_memory_then_disk_hit(dirs, vmfb):
    key = _key()
    compile_fn = Compiler(vmfb, key)
    cache = store.neff_cache()
    first = cache.get_or_compile(key, compile_fn)
    assert first.path == cache.path(key) and bytes(first.payload) == vmfb
    assert cache.get_or_compile(key, compile_fn) is first
    fresh = store.NeffCache(str(dirs[0]), str(dirs[1]))  # as another process would
    again = fresh.get_or_compile(key, compile_fn)
    assert bytes(again.payload) == vmfb and compile_fn.calls == 1
    assert cache.stats.snapshot()["hits_memory"] == 1 and fresh.stats.snapshot()["hits_disk"] == 1
    sidecar = layout.read_sidecar(str(dirs[0]), key.digest)
    assert sidecar["components"] == key.components and sidecar["graph_id"] == "add"
    assert sidecar["size"] == os.path.getsize(cache.path(key))
    assert os.listdir(dirs[1] / "neff_locks") == []  # lock files do not pile up


def test_threads_of_one_process_compile_a_key_once(dirs, vmfb):
    key = _key()
    compile_fn = Compiler(vmfb, key)

    def slow_compile() -> bytes:
        time.sleep(0.2)  # long enough for every thread to be waiting on the lock
        return compile_fn()

    cache = store.neff_cache()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: cache.get_or_compile(key, slow_compile), range(4)))
    assert compile_fn.calls == 1 and all(bytes(r.payload) == vmfb for r in results)
    assert {key: 1}[_key()] == 1  # keys are hashable and equal by content


def test_entries_are_sharded_by_digest(dirs, vmfb):
    key = _key()
    path = store.neff_cache().put(key, Compiler(vmfb, key)())
    assert path == str(dirs[0] / key.digest[:2] / key.digest[2:4] / f"{key.digest}.neff")


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_entry_is_detected_removed_recompiled_and_counted(dirs, vmfb, damage, caplog):
    key = _key()
    compile_fn = Compiler(vmfb, key)
    path = store.neff_cache().get_or_compile(key, compile_fn).path
    data = bytearray(pathlib.Path(path).read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF
    elif damage == "truncate":
        del data[len(data) // 2:]
    else:
        data = bytearray()
    pathlib.Path(path).write_bytes(data)
    cache = store.NeffCache(str(dirs[0]), str(dirs[1]))
    assert cache.get(key) is None  # never served
    assert not os.path.exists(path)  # removed
    assert cache.stats.snapshot()["corrupt"] == 1
    pathlib.Path(path).write_bytes(data)
    recompiled = cache.get_or_compile(key, compile_fn)
    assert bytes(recompiled.payload) == vmfb and compile_fn.calls == 2
    assert neff.load(path).header.key == key.digest
    assert cache.stats.snapshot()["corrupt"] == 2
    assert stats.aggregate(str(dirs[0]))[0]["corrupt"] == 2


def test_disabled_cache_compiles_every_time_and_writes_nothing(dirs, vmfb, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")
    key = _key()
    compile_fn = Compiler(vmfb, key)
    cache = store.neff_cache()
    for _ in range(3):
        assert bytes(cache.get_or_compile(key, compile_fn).payload) == vmfb
    assert compile_fn.calls == 3
    assert cache.get(key) is None and cache.put(key, compile_fn()) is None
    assert not dirs[0].exists() and not dirs[1].exists()  # no entry, no stats, no lock


def test_unwritable_cache_dir_warns_and_still_compiles(tmp_path, vmfb, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache directory should be")
    cache = store.NeffCache(str(blocker / "cache"), str(tmp_path / "locks"))
    key = _key()
    compile_fn = Compiler(vmfb, key)
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.cache"):
        logging.getLogger("torch_neuronx").addHandler(caplog.handler)
        try:
            for _ in range(2):
                assert bytes(cache.get_or_compile(key, compile_fn).payload) == vmfb
                cache.forget()  # as a new process would: nothing on disk to find
        finally:
            logging.getLogger("torch_neuronx").removeHandler(caplog.handler)
    assert compile_fn.calls == 2
    assert cache.stats.snapshot()["io_errors"] >= 2
    assert "cannot write" in caplog.text


def test_unusable_lock_dir_compiles_without_the_lock(tmp_path, vmfb):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = store.NeffCache(str(tmp_path / "cache"), str(blocker / "locks"))
    key = _key()
    assert bytes(cache.get_or_compile(key, Compiler(vmfb, key)).payload) == vmfb
    assert os.path.exists(cache.path(key))


def test_compile_fn_returning_garbage_raises_and_stores_nothing(dirs):
    key = _key()
    with pytest.raises(neff.NeffFormatError):
        store.neff_cache().get_or_compile(key, lambda: b"not a neff")
    assert not os.path.exists(store.neff_cache().path(key))
    with locks.key_lock(key.digest, timeout=0):  # and the lock was released
        pass


def test_neff_cache_is_recreated_when_the_directory_changes(dirs, tmp_path, monkeypatch):
    first = store.neff_cache()
    assert store.neff_cache() is first
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert store.neff_cache().root == str(tmp_path / "elsewhere")


def test_memory_lru_is_bounded(dirs, vmfb):
    cache = store.NeffCache(str(dirs[0]), str(dirs[1]), memory_entries=2)
    for version in "abc":
        key = _key(version)
        cache.get_or_compile(key, Compiler(vmfb, key))
    cache.get_or_compile(_key("a"), Compiler(vmfb, _key("a")))
    assert cache.stats.snapshot()["hits_disk"] == 1  # "a" had been evicted from memory


def test_stats_of_several_processes_add_up(dirs, vmfb):
    key = _key()
    for _ in range(3):
        cache = store.NeffCache(str(dirs[0]), str(dirs[1]))
        cache.get_or_compile(key, Compiler(vmfb, key))
    counts, files = stats.aggregate(str(dirs[0]))
    assert (counts["misses"], counts["compiles"], counts["hits_disk"], files) == (1, 1, 2, 3)


def test_stats_compaction_folds_finished_processes(tmp_path):
    directory = tmp_path / ".stats"
    directory.mkdir()
    host = socket.gethostname().replace("-", "_")
    for i in range(5):  # pid 999999999 does not exist: these processes have finished
        (directory / f"{host}-999999999-{i:08x}.json").write_text(json.dumps({"counts": {"misses": 2}}))
    live = stats.Stats(str(tmp_path))
    live.incr("misses")
    assert stats.compact(str(tmp_path), threshold=2) == 5
    counts, files = stats.aggregate(str(tmp_path))
    assert counts["misses"] == 11 and files == 2  # the folded file and the live process's


def test_verify_keeps_access_times(dirs, vmfb):
    key = _key()
    path = store.neff_cache().put(key, Compiler(vmfb, key)())
    os.utime(path, (1_000_000, os.stat(path).st_mtime))
    assert maintenance.verify(str(dirs[0])).ok
    assert os.stat(path).st_atime == 1_000_000


def test_miss_is_explained_at_info(dirs, vmfb):
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("torch_neuronx.cache")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        cache = store.neff_cache()
        for version in ("1.0", "2.0"):
            cache.get_or_compile(_key(version), Compiler(vmfb, _key(version)))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    messages = [r.getMessage() for r in records]
    assert messages[0] == "cache miss for add: no cached entry for this graph yet (first compile)"
    assert messages[1] == "cache miss for add: compiler_version differs (was '1.0', now '2.0')"


def test_hlo_cache_round_trip_and_corruption(dirs):
    cache = store.hlo_cache()
    assert cache.get("aten.add.Tensor(f32[?], f32[?])") is None
    path = cache.put("aten.add.Tensor(f32[?], f32[?])", ADD_MLIR)
    assert cache.get("aten.add.Tensor(f32[?], f32[?])") == ADD_MLIR
    data = bytearray(pathlib.Path(path).read_bytes())
    data[-5] ^= 0x20
    pathlib.Path(path).write_bytes(data)
    assert cache.get("aten.add.Tensor(f32[?], f32[?])") is None
    assert not os.path.exists(path) and cache.stats.snapshot()["corrupt"] == 1


def test_hlo_cache_probes_are_not_hits_or_misses(dirs):
    """The eager device asks whether an op family has a dynamic-shape kernel on every run: each
    such probe counted a miss, so a fully warm run's caches table said the cache was cold."""
    cache = store.hlo_cache()
    assert cache.get("probe", counted=False) is None
    cache.put("probe", ADD_MLIR)
    assert cache.get("probe", counted=False) == ADD_MLIR
    counts = cache.stats.snapshot()
    assert counts["misses"] == 0 and counts["hits_disk"] == 0
    assert cache.get("probe") == ADD_MLIR and cache.stats.snapshot()["hits_disk"] == 1


def test_a_valid_neff_of_another_key_at_an_entrys_path_is_never_served(dirs, vmfb):
    """A copy mishap on a shared mount (one entry's file over another's) left a valid NEFF whose
    header names another key: it was served (another graph's results) and `verify` called it good."""
    first, second = _key(graph_id="first"), _key(version="other", graph_id="second")
    cache = store.neff_cache()
    path = cache.put(first, Compiler(vmfb, first)())
    other = cache.put(second, Compiler(vmfb, second)())
    pathlib.Path(path).write_bytes(pathlib.Path(other).read_bytes())
    report = maintenance.verify(str(dirs[0]))
    assert not report.ok and "holds the NEFF of key" in report.bad[0][1]
    fresh = store.NeffCache(str(dirs[0]), str(dirs[1]))
    assert fresh.get(first) is None and not os.path.exists(path)  # removed, never served
    assert fresh.stats.snapshot()["corrupt"] == 1
    assert fresh.get(second) is not None


def test_bytes_read_and_written_count_whole_files_and_hlo_stores_count_as_compiles(dirs, vmfb):
    """A NEFF read back counted its payload only (11325 read for 15421 written), and the HLO
    cache's ``compiles`` stayed 0 while it stored entries."""
    key = _key(graph_id="counted")
    writer = store.NeffCache(str(dirs[0]), str(dirs[1]))
    path = writer.put(key, Compiler(vmfb, key)())
    reader = store.NeffCache(str(dirs[0]), str(dirs[1]))
    assert reader.get(key) is not None
    assert reader.stats.snapshot()["bytes_read"] == writer.stats.snapshot()["bytes_written"] == os.path.getsize(path)
    hlo = store.hlo_cache()
    before = hlo.stats.snapshot()["compiles"]
    hlo.put("counted-entry", "module {}")
    assert hlo.stats.snapshot()["compiles"] == before + 1
