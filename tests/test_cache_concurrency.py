"""The cache under many real processes: one compile per key, crash safety, locks, shared dirs."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from iree_add import ADD_MLIR, CONFIG, IREE_FLAGS

from torch_neuronx.cache import keys, locks, maintenance, store
from torch_neuronx.format import neff

VERSION = "iree-3.13.0"

# A worker process. Modes: "compile" (get_or_compile with the real compiler, counting its
# calls in a counter file), "pause" (the same, but stops between writing the entry and
# renaming it into place, for the parent to SIGKILL), "hold" (holds the key's lock).
WORKER = r"""
import json, os, subprocess, sys, time
from torch_neuronx.cache import atomic, keys, locks, store
from torch_neuronx.format import neff

spec = json.loads(sys.argv[1])
key = keys.neff_key(spec["hlo"], spec["config"], spec["version"], graph_id="add")

def touch(path, text=""):
    with open(path, "w") as f:
        f.write(text)

if spec["mode"] == "hold":
    with locks.key_lock(key.digest, timeout=10):
        touch(spec["ready"])
        time.sleep(600)

def compile_fn():
    with open(spec["counter"], "a") as f:
        f.write(f"{os.getpid()}\n")
    out = os.path.join(spec["work"], f"add-{os.getpid()}.vmfb")
    subprocess.run([spec["iree"], spec["mlir"], *spec["flags"], "-o", out], check=True)
    with open(out, "rb") as f:
        return neff.encode(f.read(), target="cpu", compiler_version=spec["version"], key=key.digest)

if spec["mode"] == "pause":
    def pause(tmp, final):
        if final.endswith(".neff"):
            touch(spec["ready"], tmp)
            time.sleep(600)
    atomic.before_rename_hook = pause

if spec.get("go"):  # start together: say we are ready, wait for the parent's signal
    touch(spec["go"] + f".ready-{os.getpid()}")
    while not os.path.exists(spec["go"]):
        time.sleep(0.01)
cache = store.neff_cache()
result = cache.get_or_compile(key, compile_fn)
print(json.dumps({"path": result.path, "sha": result.header.payload_sha256,
                  "bytes": len(result.payload), "stats": cache.stats.snapshot()}))
"""


@pytest.fixture
def work(tmp_path) -> pathlib.Path:
    (tmp_path / "add.mlir").write_text(ADD_MLIR)
    return tmp_path


def _key() -> keys.CacheKey:
    return keys.neff_key(ADD_MLIR, CONFIG, VERSION, graph_id="add")


_children: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _kill_leftover_children():
    """A failing test must not leave workers sleeping or waiting for a start signal."""
    yield
    while _children:
        child = _children.pop()
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=30)


def _spawn(work: pathlib.Path, mode: str, *, node: str = "node0", go: str = "", ready: str = "",
           counter: str = "") -> subprocess.Popen:
    spec = {"mode": mode, "hlo": ADD_MLIR, "config": CONFIG, "version": VERSION, "go": go,
            "ready": ready, "counter": counter or str(work / f"compiles-{node}.txt"), "work": str(work),
            "mlir": str(work / "add.mlir"), "flags": IREE_FLAGS,
            "iree": os.path.join(os.path.dirname(sys.executable), "iree-compile")}
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=str(work / "shared_neff_cache"),
               TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=str(work / f"local-{node}"))
    env.pop("TORCH_NEURONX_NEFF_DISABLE_CACHE", None)
    child = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(spec)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _children.append(child)
    return child


def _wait_for(path: pathlib.Path | str, timeout: float = 60.0, count: int = 0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count and len(list(pathlib.Path(path).parent.glob(pathlib.Path(path).name))) >= count:
            return
        if not count and os.path.exists(path):
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {path}")


def _results(procs: list[subprocess.Popen]) -> list[dict]:
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _start_together(work: pathlib.Path, nodes: list[str]) -> list[dict]:
    go = str(work / "go")
    procs = [_spawn(work, "compile", node=node, go=go) for node in nodes]
    _wait_for(go + ".ready-*", count=len(procs))
    pathlib.Path(go).touch()
    return _results(procs)


def test_eight_processes_on_a_cold_cache_compile_once(work):
    results = _start_together(work, ["node0"] * 8)
    assert _lines(work / "compiles-node0.txt") == 1
    assert len({r["sha"] for r in results}) == 1 and all(r["bytes"] > 0 for r in results)
    assert sum(r["stats"]["compiles"] for r in results) == 1
    assert sum(r["stats"]["hits_disk"] for r in results) == 7
    assert neff.load(results[0]["path"]).header.key == _key().digest


def test_writer_killed_before_rename_leaves_no_partial_entry(work):
    ready = work / "paused"
    writer = _spawn(work, "pause", ready=str(ready))
    _wait_for(ready)
    temp = ready.read_text()
    root, local = str(work / "shared_neff_cache"), str(work / "local-node0")
    reader = store.NeffCache(root, str(work / "local-reader"))
    assert os.path.exists(temp)  # fully written, not yet renamed
    assert reader.get(_key()) is None and not os.path.exists(reader.path(_key()))
    with pytest.raises(locks.LockTimeoutError):  # the writer still holds the key's lock
        with locks.key_lock(_key().digest, timeout=0, directory=local):
            pass
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    with locks.key_lock(_key().digest, timeout=5, directory=local):  # released by the kernel
        pass
    assert reader.get(_key()) is None
    report = maintenance.verify(root)
    assert report.bad == [] and report.leftovers == [temp]  # the orphan temp is found ...
    (result,) = _results([_spawn(work, "compile")])  # ... and the next run succeeds
    assert _lines(work / "compiles-node0.txt") == 2
    assert neff.load(result["path"]).header.key == _key().digest
    assert maintenance.verify(root, repair=True).ok and not os.path.exists(temp)


def test_lock_timeout_names_the_key_the_lock_file_and_the_holder(work):
    local = str(work / "local-node0")
    holder = _spawn(work, "hold", ready=str(work / "holding"))
    try:
        _wait_for(work / "holding")
        started = time.monotonic()
        with pytest.raises(locks.LockTimeoutError) as info:
            with locks.key_lock(_key().digest, timeout=0.3, directory=local):
                pass
        assert 0.3 <= time.monotonic() - started < 5
        message = str(info.value)
        assert _key().digest in message
        assert locks.lock_path(_key().digest, local) in message
        assert f"pid {holder.pid}" in message and info.value.holder["pid"] == holder.pid
    finally:
        holder.kill()
        holder.communicate(timeout=30)


def test_lock_timeout_comes_from_the_environment(work, monkeypatch):
    local = str(work / "local-node0")
    holder = _spawn(work, "hold", ready=str(work / "holding"))
    try:
        _wait_for(work / "holding")
        monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "0")
        monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", local)
        monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(work / "shared_neff_cache"))
        with pytest.raises(locks.LockTimeoutError):
            store.neff_cache().get_or_compile(_key(), lambda: pytest.fail("must not compile"))
    finally:
        holder.kill()
        holder.communicate(timeout=30)


def test_lock_released_when_holder_dies(work):
    local = str(work / "local-node0")
    holder = _spawn(work, "hold", ready=str(work / "holding"))
    _wait_for(work / "holding")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with locks.key_lock(_key().digest, timeout=2, directory=local) as state:
        assert locks.read_holder(state.path)["pid"] == os.getpid()


def test_two_nodes_on_one_shared_dir_compile_at_most_once_each(work):
    results = _start_together(work, ["nodeA", "nodeB"] * 3)
    per_node = [_lines(work / f"compiles-{node}.txt") for node in ("nodeA", "nodeB")]
    assert all(n <= 1 for n in per_node) and sum(per_node) >= 1
    assert len({r["sha"] for r in results}) == 1
    report = maintenance.verify(str(work / "shared_neff_cache"))
    assert report.checked == 1 and report.bad == [] and report.leftovers == []


DRIVER_WORKER = r"""
import os, sys, time
from iree_add import ADD_MLIR
from torch_neuronx.compiler import driver, targets
from torch_neuronx.format import neff

go = sys.argv[1]
open(go + f".ready-{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
cpu = targets.resolve("cpu")
for _ in range(3):
    data = driver.compile_neff(driver.CompileJob(stablehlo=ADD_MLIR, target=cpu, flags=cpu.flags,
                                                 key="c" * 64, graph_name="add"))
    neff.decode(data)  # verified
print("ok")
"""


def test_processes_compiling_one_key_at_once_without_the_cache_each_get_their_neff(work):
    """With the cache off nothing serializes compiles of one key: processes compiling it at once
    shared one work directory and deleted each other's files (FileNotFoundError, an empty
    payload); each now compiles in its own, and the kept one is the key's documented directory."""
    env = dict(os.environ, TORCH_NEURONX_DEBUG_DIR=str(work / "debug"),
               TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS="1",
               PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    go = str(work / "go")
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER_WORKER, go], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    _children.extend(procs)
    _wait_for(go + ".ready-*", count=3, timeout=120)
    pathlib.Path(go).touch()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip() == "ok", err[-3000:]
    kept = sorted(os.listdir(work / "debug" / "neuronx-cc"))
    assert kept == ["c" * 32], kept
    assert os.path.exists(work / "debug" / "neuronx-cc" / ("c" * 32) / "module.neff")
