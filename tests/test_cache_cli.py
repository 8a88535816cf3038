"""``python -m torch_neuronx.cache``: ls, stats, verify, prune, explain, clear (real subprocesses)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from iree_add import ADD_MLIR, build

from torch_neuronx.cache import keys, store
from torch_neuronx.format import neff

# One run of a program: compile the add module with the given compiler version, from a
# prebuilt payload (the key, not the payload, is what these tests are about).
RUN = r"""
import sys
from torch_neuronx.cache import keys, store
from torch_neuronx.format import neff
mlir, vmfb, version, target = sys.argv[1:5]
key = keys.neff_key(open(mlir).read(), {"target": target}, version, graph_id="add")
payload = open(vmfb, "rb").read()
store.neff_cache().get_or_compile(
    key, lambda: neff.encode(payload, target=target, compiler_version=version, key=key.digest))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """A directory with add.mlir and add.vmfb, compiled once by the real compiler."""
    return build(tmp_path_factory.mktemp("iree"))


@pytest.fixture
def root(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff_cache"))
    monkeypatch.setenv("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("TORCH_NEURONX_HLO_CACHE_DIR", str(tmp_path / "hlo_cache"))
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("TORCH_NEURONX_LOG_LEVEL", raising=False)
    return tmp_path / "neff_cache"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch_neuronx.cache", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def _run(built: pathlib.Path, version: str, target: str = "cpu", **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", RUN, str(built / "add.mlir"), str(built / "add.vmfb"),
                           version, target], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def _populate(built: pathlib.Path, versions: str = "abc") -> list[keys.CacheKey]:
    cache = store.neff_cache()
    made = []
    for version in versions:
        key = keys.neff_key(ADD_MLIR, {"target": "cpu"}, version, graph_id=f"graph-{version}")
        cache.put(key, neff.encode((built / "add.vmfb").read_bytes(), target="cpu",
                                   compiler_version=version, key=key.digest))
        made.append(key)
    cache.stats.flush()
    return made


def test_ls_lists_entries_with_their_graphs(root, built):
    made = _populate(built)
    proc = _cli("ls")
    assert proc.returncode == 0
    for key in made:
        assert key.digest[:16] in proc.stdout and key.graph_id in proc.stdout
    assert "3 entries" in proc.stdout
    rows = json.loads(_cli("ls", "--json").stdout)
    assert {r["digest"] for r in rows} == {k.digest for k in made}


def test_ls_of_an_empty_or_missing_cache(root):
    proc = _cli("ls")
    assert proc.returncode == 0 and "is empty" in proc.stdout


def test_dir_option_wins_over_the_environment_before_or_after_the_command(root, built, tmp_path):
    _populate(built, "a")
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "other")}
    assert "is empty" in _cli("ls", env=env).stdout
    assert "1 entries" in _cli("--dir", str(root), "ls", env=env).stdout
    assert "1 entries" in _cli("ls", "--dir", str(root), env=env).stdout


def test_stats_counts_entries_hits_misses_and_corrupt(root, built):
    _run(built, "1.0")
    _run(built, "1.0")
    result = json.loads(_cli("stats", "--json").stdout)
    assert (result["entries"], result["misses"], result["compiles"], result["hits_disk"]) == (1, 1, 1, 1)
    assert result["bytes"] > len((built / "add.vmfb").read_bytes())
    path = next(root.rglob("*.neff"))
    path.write_bytes(path.read_bytes()[:-10])
    _run(built, "1.0")
    text = _cli("stats").stdout
    assert "corrupt       1" in text and "compiles      2" in text


def test_verify_reports_bad_entries_and_repair_removes_them(root, built):
    made = _populate(built)
    bad = store.neff_cache().path(made[1])
    data = bytearray(pathlib.Path(bad).read_bytes())
    data[-1] ^= 1
    pathlib.Path(bad).write_bytes(data)
    proc = _cli("verify")
    assert proc.returncode == 1
    assert f"BAD  {bad}" in proc.stdout and "fails its checksum" in proc.stdout
    assert "2 good, 1 bad" in proc.stdout
    proc = _cli("verify", "--repair")
    assert proc.returncode == 0 and "removed 1 bad entries" in proc.stdout
    assert not os.path.exists(bad)
    assert _cli("verify").returncode == 0


def test_prune_by_age_then_by_size_evicts_least_recently_used(root, built):
    made = _populate(built, "abcd")
    now = time.time()
    for age_days, key in zip((10, 3, 2, 1), made, strict=True):
        path = store.neff_cache().path(key)
        os.utime(path, (now - age_days * 86400, now - age_days * 86400))
    proc = _cli("prune", "--older-than", "7d")
    assert proc.returncode == 0 and "removed 1 entries" in proc.stdout
    assert not os.path.exists(store.neff_cache().path(made[0]))
    size = os.path.getsize(store.neff_cache().path(made[1]))
    proc = _cli("prune", "--max-bytes", str(2 * size))
    assert proc.returncode == 0 and "removed 1 entries" in proc.stdout and "2 entries" in proc.stdout
    assert not os.path.exists(store.neff_cache().path(made[1]))
    assert all(os.path.exists(store.neff_cache().path(k)) for k in made[2:])


@pytest.mark.parametrize("args", [["prune"], ["prune", "--older-than", "soon"],
                                  ["prune", "--max-bytes", "lots"], ["frobnicate"]])
def test_usage_errors_exit_2_with_a_message(root, args):
    proc = _cli(*args)
    assert proc.returncode == 2 and "error:" in proc.stderr


def test_a_file_in_place_of_the_directory_exits_1(tmp_path):
    (tmp_path / "file").write_text("")
    proc = _cli("--dir", str(tmp_path / "file"), "ls")
    assert proc.returncode == 1 and "is not a directory" in proc.stderr


def test_explain_names_the_component_that_changed_in_the_last_run(root, built):
    _run(built, "1.0")
    proc = _run(built, "2.0", TORCH_NEURONX_LOG_LEVEL="2")
    expected = "cache miss for add: compiler_version differs (was '1.0', now '2.0')"
    assert expected in proc.stderr
    shown = _cli("explain")
    assert shown.returncode == 0 and expected in shown.stdout and "1 cache misses" in shown.stdout
    _run(built, "2.0", target="cuda")
    shown = _cli("explain").stdout
    assert "compiler_config differs (target: was 'cpu', now 'cuda')" in shown
    assert "compiler_version" not in shown


def test_explain_with_nothing_recorded(root):
    proc = _cli("explain")
    assert proc.returncode == 0 and "no cache misses recorded" in proc.stdout


def test_clear_removes_entries_and_records(root, built, tmp_path):
    _populate(built)
    _run(built, "z")
    hlo = store.hlo_cache()
    hlo.put("k", "text")
    proc = _cli("clear", "--hlo")
    assert proc.returncode == 0 and "removed 4 entries" in proc.stdout and "removed 1 HLO" in proc.stdout
    assert list(root.rglob("*.neff")) == [] and list(root.rglob("*.json")) == []
    assert hlo.get("k") is None
    assert "is empty" in _cli("ls").stdout


def test_explain_shows_the_flag_that_was_added():
    """Both flag lists were cut at one length ("..."), hiding the flag that differed."""
    from torch_neuronx.cache import explain

    flags = [f"--iree-some-long-flag-number-{i}=value" for i in range(8)]
    said = explain._change("flags", flags, [*flags, "--iree-opt-level=O1"])
    assert said == "flags: removed [], added ['--iree-opt-level=O1']"
    assert explain._change("target", "cpu", "cuda") == "target: was 'cpu', now 'cuda'"


def test_clear_and_prune_of_a_read_only_cache_fail_saying_so(root, built, tmp_path):
    """On a read-only mount nothing can be removed: ``clear`` and ``prune`` reported success (exit 0).
    A read-only tmpfs is the real thing; where this machine cannot mount one, the test is skipped."""
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(mount / "neff")}
        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(mount / "neff")
        try:
            _populate(built, "a")
        finally:
            os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(root)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        for args in (("clear",), ("prune", "--max-bytes", "0"), ("prune", "--older-than", "0s")):
            proc = _cli(*args, env=env)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            assert "not writable" in proc.stderr, (args, proc.stderr)
        assert "1 entries" in _cli("ls", env=env).stdout
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
