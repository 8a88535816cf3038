"""The configuration registry: coverage of the specification, typed parsing, rendering."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys

import pytest

from torch_neuronx import config, log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "docs", "torchneuron-environment-variables.txt")
_ROW = re.compile(r"^([A-Z][A-Z0-9_]+)\t(bool|int|str|path)\t([^\t]*)\t")


def spec_rows() -> list[tuple[str, str, str]]:
    with open(SPEC) as f:
        return [m.groups() for m in map(_ROW.match, f) if m]


def test_registry_has_every_specified_variable_with_its_type():
    rows = spec_rows()
    assert len(rows) >= 35
    for name, typ, _ in rows:
        assert config.var(name).type == typ, name
    assert config.var("TORCH_NEURONX_DYNAMO_TENSOR_DUMPS")
    assert config.var("TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG")


@pytest.mark.parametrize("name,typ,default", spec_rows())
def test_default_matches_specification(name, typ, default, monkeypatch):
    monkeypatch.delenv(name, raising=False)
    entry = config.var(name)
    if typ == "bool" and default in ("True", "False", "1", "0"):
        assert config.get(name) is (default in ("True", "1"))
    elif typ == "int":
        assert config.get(name) == int(default)
    else:
        assert entry.documented_default().strip('"') == default.strip('"').replace("\"\"", ""), name


@pytest.mark.parametrize("raw,expected", [
    ("1", True), ("0", False), ("true", True), ("FALSE", False), ("Yes", True), ("nO", False), (" 1 ", True),
])
def test_bool_accepts_documented_spellings(raw, expected, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", raw)
    assert config.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS") is expected


def test_malformed_value_warns_once_and_uses_default(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "ten minutes")
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        assert config.get("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT") == 1200
        assert config.get("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT") == 1200
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT" in warnings[0]
    assert "ten minutes" in warnings[0] and "decimal integer" in warnings[0]


@pytest.mark.parametrize("name,raw,default,says", [
    # a count or range built every index before its check (1e23: a raw OverflowError, 0-99999999: minutes)
    ("TORCH_NEURONX_VISIBLE_DEVICES", "99999999999999999999999", (), "at most 128 devices"),
    ("TORCH_NEURONX_VISIBLE_DEVICES", "0-99999999999", (), "at most 128 devices"),
    ("TORCH_NEURONX_VISIBLE_DEVICES", "0,1-200", (), "at most 128 devices"),
    # a huge timeout broke every compile ("OverflowError: timestamp out of range")
    ("TORCH_NEURONX_LOWERING_TIMEOUT", "99999999999", 1200, "at most 1000000 seconds"),
    ("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "1" + "0" * 30, 1200, "at most 1000000 seconds"),
    # 0 was taken: every lowering "took longer than 0 s" (eager ops on the CPU, compiles failed)
    ("TORCH_NEURONX_LOWERING_TIMEOUT", "0", 1200, "expected a positive number of seconds"),
])
def test_huge_values_warn_and_take_the_default(name, raw, default, says, monkeypatch, caplog):
    monkeypatch.setenv(name, raw)
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        assert config.get(name) == default
    (warning,) = [r.getMessage() for r in caplog.records]
    assert name in warning and says in warning


def test_the_largest_accepted_values_are_taken(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_VISIBLE_DEVICES", "0-127")
    assert len(config.get("TORCH_NEURONX_VISIBLE_DEVICES")) == 128
    monkeypatch.setenv("TORCH_NEURONX_LOWERING_TIMEOUT", "1000000")
    assert config.get("TORCH_NEURONX_LOWERING_TIMEOUT") == 1000000


def test_malformed_bool_names_accepted_values(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_NEURONX_COMPILE_ONLY", "maybe")
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        assert config.get("TORCH_NEURONX_COMPILE_ONLY") is False
    assert "TORCH_NEURONX_COMPILE_ONLY" in caplog.text and "'maybe'" in caplog.text
    assert "true" in caplog.text and "yes" in caplog.text


@pytest.mark.parametrize("raw", ["true", "abc", "2", ""])
def test_streams_flag_accepts_only_0_and_1(monkeypatch, raw):
    """The specification accepts only 0 and 1: anything else is an error naming the variable,
    on every read (not a warning and the default)."""
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", raw)
    for _ in range(2):
        with pytest.raises(config.InvalidVariableError, match="TORCH_NEURONX_ENABLE_STREAMS=.*only 0 and 1"):
            config.get("TORCH_NEURONX_ENABLE_STREAMS")
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", "0")
    assert config.get("TORCH_NEURONX_ENABLE_STREAMS") is False
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", " 1 ")
    assert config.get("TORCH_NEURONX_ENABLE_STREAMS") is True


def test_invalid_streams_flag_fails_the_first_device_use():
    """A program that only runs eager ops on the default stream meets the error at its first op."""
    code = "import torch, torch_neuronx\ntorch.ones(2, device='neuron') + 1\n"
    env = {**os.environ, "TORCH_NEURONX_ENABLE_STREAMS": "abc"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "InvalidVariableError: TORCH_NEURONX_ENABLE_STREAMS='abc' is not valid: only 0 and 1" in run.stderr


def test_split_collectives_only_1_enables(monkeypatch):
    monkeypatch.delenv("NEURON_USE_SPLIT_ALLGATHER", raising=False)
    assert config.get("NEURON_USE_SPLIT_ALLGATHER") is None  # unset: depends on the stream
    monkeypatch.setenv("NEURON_USE_SPLIT_ALLGATHER", "1")
    assert config.get("NEURON_USE_SPLIT_ALLGATHER") is True
    monkeypatch.setenv("NEURON_USE_SPLIT_ALLGATHER", "true")
    assert config.get("NEURON_USE_SPLIT_ALLGATHER") is False


def test_option_overrides_environment_and_reports_source(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "cpu")
    assert config.lookup("NEURON_PLATFORM_TARGET_OVERRIDE") == ("cpu", "environment")
    with config.override(NEURON_PLATFORM_TARGET_OVERRIDE="cuda"):
        assert config.lookup("NEURON_PLATFORM_TARGET_OVERRIDE") == ("cuda", "option")
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")
    assert config.lookup("NEURON_PLATFORM_TARGET_OVERRIDE") == (None, "default")


def test_overrides_belong_to_the_thread_that_set_them():
    import threading

    seen = []
    with config.override(TORCH_NEURONX_COMPILE_ONLY=True):
        thread = threading.Thread(target=lambda: seen.append(config.lookup("TORCH_NEURONX_COMPILE_ONLY")))
        thread.start()
        thread.join()
        assert config.lookup("TORCH_NEURONX_COMPILE_ONLY") == (True, "option")
    assert seen == [(False, "default")]


def test_environment_reads_follow_every_change_of_os_environ(monkeypatch):
    name = "TORCH_NEURONX_PROFILE_MODES"  # a str variable that takes any value, the empty one too
    monkeypatch.delenv(name, raising=False)
    assert config._environ(name) is None
    for value in ("model", "mod\u00e8le", ""):
        monkeypatch.setenv(name, value)
        assert config._environ(name) == os.environ[name] == value
        assert config.get(name) == value
    os.environ.update({name: "updated"})
    assert config.get(name) == "updated"
    monkeypatch.delenv(name)
    assert config._environ(name) is None


def test_unknown_variable_is_a_clear_error():
    with pytest.raises(KeyError, match="not a torch_neuronx configuration variable"):
        config.get("TORCH_NEURONX_NO_SUCH_THING")


def test_cli_prints_every_variable_with_value_and_source():
    env = {**os.environ, "TORCH_NEURONX_LOG_LEVEL": "3", "TORCH_NEURONX_METRICS_DIR": "/tmp/m"}
    out = subprocess.run([sys.executable, "-m", "torch_neuronx.config"], env=env, capture_output=True,
                         text=True, check=True).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert set(lines) == {v.name for v in config.variables()}
    assert lines["TORCH_NEURONX_LOG_LEVEL"] == ["3", "environment"]
    assert lines["TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"] == ["0", "default"]


def test_environment_doc_is_generated_from_registry():
    with open(os.path.join(ROOT, "docs", "environment.md")) as f:
        assert f.read() == config.render_markdown(), "docs/environment.md is stale: run `make docs`"


def test_unbuilt_features_are_marked_in_the_doc():
    doc = config.render_markdown()
    for entry in config.variables():
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{entry.name}` |"))
        assert entry.status in row


@pytest.mark.parametrize("level,expected", [("0", logging.ERROR), ("1", logging.WARNING),
                                            ("2", logging.INFO), ("3", logging.DEBUG), ("7", logging.WARNING)])
def test_log_level_sets_the_torch_neuronx_logger(level, expected, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_LOG_LEVEL", level)
    try:
        assert log.configure().level == expected
        assert logging.getLogger("torch_neuronx.compiler.driver").getEffectiveLevel() == expected
    finally:
        monkeypatch.delenv("TORCH_NEURONX_LOG_LEVEL")
        log.configure()


# -- readers: derived from the source -----------------------------------------

# Registered (the specification lists them) but not read by any code yet: each one's feature is
# still to be built (its status says which issue owes it). Remove a name once code reads it; a
# new unread variable fails the test until it is read or listed here.
UNREAD_YET = frozenset({
})


@pytest.fixture(scope="module")
def reads():
    from torch_neuronx.config import readers

    return readers.scan()


def _where(found) -> str:
    return ", ".join(f"{r.path}:{r.line}" for r in found)


def test_every_read_names_a_registered_variable(reads):
    assert len(reads) >= 40  # the scanner sees the package's reads at all
    unresolved = [r for r in reads if r.name is None]
    assert not unresolved, f"reads whose variable name the scanner cannot resolve: {_where(unresolved)}"
    unknown = [r for r in reads if r.name not in config._REGISTRY]
    assert not unknown, f"unregistered variables read at {_where(unknown)}: {sorted({r.name for r in unknown})}"


def test_reading_an_unregistered_name_raises():
    name = "TORCH_NEURONX_NO_SUCH_THING"
    for read in (config.get, config.lookup, config.var):
        with pytest.raises(KeyError, match="not a torch_neuronx configuration variable"):
            read(name)
    with pytest.raises(KeyError, match="not a torch_neuronx configuration variable"):
        with config.override(**{name: 1}):
            pass


def test_derived_readers_include_every_file_quoting_the_name(reads):
    """What grep finds: every package source outside config quoting "NAME" reads NAME."""
    from torch_neuronx.config import readers

    root = readers.package_root()
    config_dir = os.path.dirname(config.__file__)
    derived = readers.code_readers(reads)
    sources = {}
    for path in sorted(root.rglob("*.py")):
        if not str(path).startswith(config_dir + os.sep):
            sources[readers.module_name(path, root)] = path.read_text(encoding="utf-8")
    checked = 0
    for entry in config.variables():
        quoted = (f'"{entry.name}"', f"'{entry.name}'")
        grepped = {module for module, text in sources.items() if any(q in text for q in quoted)}
        assert grepped <= set(derived.get(entry.name, ())), (entry.name, grepped - set(derived.get(entry.name, ())))
        checked += bool(grepped)
    assert checked >= 25


def test_every_variable_has_a_reader_in_code_or_outside(reads):
    from torch_neuronx.config import readers

    derived = readers.code_readers(reads)
    unread = {v.name for v in config.variables() if not derived.get(v.name) and not v.external_readers}
    assert unread == UNREAD_YET, {"newly unread": unread - UNREAD_YET, "now read": UNREAD_YET - unread}
    assert all(config.var(name).status != "built" for name in unread)


def test_doc_lists_the_derived_readers(reads):
    from torch_neuronx.config import readers

    derived = readers.code_readers(reads)
    doc = config.render_markdown()
    for entry in config.variables():
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{entry.name}` |"))
        cell = row.split(" | ")[4]
        assert cell == (", ".join([*(f"`{m}`" for m in derived.get(entry.name, ())), *entry.external_readers])
                        or "(none)"), entry.name


def _package(tmp_path, files: dict[str, str]):
    root = tmp_path / "torch_neuronx"
    for name, text in {"__init__.py": "", "config/__init__.py": "def get(name): ...\n", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_scanner_finds_every_access_pattern(tmp_path):
    from torch_neuronx.config import readers

    root = _package(tmp_path, {
        "plain.py": "from torch_neuronx import config\nconfig.get('A')\nconfig.lookup(name='B')\n",
        "aliased.py": "import torch_neuronx.config as cfg\nimport torch_neuronx\ncfg.get('C')\n"
                      "torch_neuronx.config.get('D')\n",
        "functions.py": "from torch_neuronx.config import get as g\nfrom torch_neuronx.config.registry import lookup\n"
                        "def f():\n    g('E')\n    return lookup('F')\n",
        "sub/__init__.py": "from .. import config\nconfig.get('G')\n",
        "sub/rel.py": "from ..config import get\nfrom . import helpers\nget('H')\nhelpers.flag('I')\n"
                      "helpers.twice(name='J')\nhelpers.env('K')\n",
        "sub/helpers.py": "from torch_neuronx import config\nimport os\nENV = 'L'\n"
                          "def flag(name):\n    return config.get(name)\n"
                          "def twice(*, name):\n    return flag(name)\n"
                          "def env(key):\n    return os.environ.get(key)\nconfig.get(ENV)\n",
        "consts.py": "from torch_neuronx import config\nfrom torch_neuronx.sub import helpers\n"
                     "from torch_neuronx.sub.helpers import ENV\nconfig.get(helpers.ENV)\nconfig.get(ENV)\n",
        "lazy.py": "def f():\n    from torch_neuronx import config\n    return config.get(f\"{'M'}\")\n",
        "environ.py": "import os\nfrom os import environ\nos.environ['N']\n'O' in os.environ\nos.getenv('P')\n"
                      "environ.get('Q')\nos.environ['NOT_A_READ'] = '1'\n",
        "other.py": "import torch\nfrom torch_neuronx import config\ntorch._dynamo.config.get('NOT_OURS')\n"
                    "config.var('NOT_A_READ')\n",
        "dynamic.py": "from torch_neuronx import config\nclass C:\n    def m(self, name):\n"
                      "        return config.get(name)\n",
    })
    found = readers.scan(root)
    assert readers.code_readers(found) == {
        "A": ("plain",), "B": ("plain",), "C": ("aliased",), "D": ("aliased",), "E": ("functions",),
        "F": ("functions",), "G": ("sub",), "H": ("sub.rel",), "I": ("sub.rel",), "J": ("sub.rel",),
        "K": ("sub.rel",), "L": ("consts", "sub.helpers"), "N": ("environ",), "O": ("environ",),
        "P": ("environ",), "Q": ("environ",),
    }
    assert {r.via for r in found if r.name == "K"} == {"environ"}
    unresolved = sorted((r.module, r.line) for r in found if r.name is None)
    assert unresolved == [("dynamic", 4), ("lazy", 3)]  # a method's parameter, an f-string


def test_scanner_follows_changes_of_the_source(tmp_path):
    from torch_neuronx.config import readers

    root = _package(tmp_path, {"a.py": "from torch_neuronx import config\nconfig.get('A')\n"})
    assert readers.code_readers(readers.scan(root)) == {"A": ("a",)}
    (root / "b" / "c.py").parent.mkdir()
    (root / "b" / "c.py").write_text("from torch_neuronx import config\nconfig.get('A')\n")
    (root / "a.py").write_text("")
    assert readers.code_readers(readers.scan(root)) == {"A": ("b.c",)}


def test_a_directory_that_cannot_be_made_warns_once_and_takes_the_default(tmp_path, monkeypatch, caplog):
    from torch_neuronx.config import directories

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setitem(config._REGISTRY, "TORCH_NEURONX_DEBUG_DIR", dataclasses.replace(
        config.var("TORCH_NEURONX_DEBUG_DIR"), default=str(tmp_path / "default")))
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path / "made" / "deep"))
    assert directories.directory("TORCH_NEURONX_DEBUG_DIR") == str(tmp_path / "made" / "deep")
    assert (tmp_path / "made" / "deep").is_dir()
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(blocker / "under"))
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        for _ in range(3):
            assert directories.directory("TORCH_NEURONX_DEBUG_DIR") == str(tmp_path / "default")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "TORCH_NEURONX_DEBUG_DIR" in warnings[0] and "a_file" in warnings[0]
    monkeypatch.setitem(config._REGISTRY, "TORCH_NEURONX_DEBUG_DIR", dataclasses.replace(
        config.var("TORCH_NEURONX_DEBUG_DIR"), default=str(blocker / "default")))
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(blocker / "other"))
    with pytest.raises(directories.UnusableDirectoryError, match="TORCH_NEURONX_DEBUG_DIR=.*nor can its default"):
        directories.directory("TORCH_NEURONX_DEBUG_DIR")


def test_a_default_another_user_made_first_gives_way_to_this_users_own(tmp_path, monkeypatch, caplog):
    """A second user on a shared machine: the default ``/tmp/neuron_backend`` exists, made by another
    user (not writable here; a file stands in for it, as root can write anything), and every
    compile raised UnusableDirectoryError; this user's sibling of the default is used instead."""
    import getpass

    from torch_neuronx.config import directories

    taken = tmp_path / "neuron_backend"
    taken.write_text("")
    monkeypatch.setitem(config._REGISTRY, "TORCH_NEURONX_DEBUG_DIR", dataclasses.replace(
        config.var("TORCH_NEURONX_DEBUG_DIR"), default=str(taken)))
    monkeypatch.delenv("TORCH_NEURONX_DEBUG_DIR", raising=False)
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        for _ in range(2):
            assert directories.directory("TORCH_NEURONX_DEBUG_DIR") == f"{taken}-{getpass.getuser()}"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "TORCH_NEURONX_DEBUG_DIR" in warning and "this user's" in warning
    assert (tmp_path / f"neuron_backend-{getpass.getuser()}").is_dir()


def test_unusable_debug_and_lock_directories_still_compile_and_say_which_variable(tmp_path):
    """A compile with TORCH_NEURONX_DEBUG_DIR and TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR through a file:
    the artifacts and the compiler's work directory go to the default debug directory, the compile
    runs without its lock; each warning names its variable (the lock's used to name the NEFF cache)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code = ("import torch, torch_neuronx\n"
            "f = torch.compile(lambda a: a * 3 + 7, backend='neuron')\n"
            "print('VALUE', f(torch.ones(3)).tolist())\n")
    env = {**os.environ, "TORCH_NEURONX_DEBUG_DIR": str(blocker / "debug"),
           "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": str(blocker / "locks"),
           "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"), "TORCH_NEURONX_HLO_CACHE_DIR": str(tmp_path / "hlo")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "VALUE [10.0, 10.0, 10.0]" in run.stdout, run.stderr[-3000:]
    assert "TORCH_NEURONX_DEBUG_DIR=" in run.stderr and "using the default /tmp/neuron_backend" in run.stderr
    assert "NEFF compile locks (TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR): cannot take the compile lock" in run.stderr


def test_cli_shows_a_refused_value_instead_of_dying_with_a_traceback():
    """A strict variable's bad value (TORCH_NEURONX_ENABLE_STREAMS accepts only 0 and 1) made the
    tool meant to show the configuration die with a bare InvalidVariableError traceback."""
    env = {**os.environ, "TORCH_NEURONX_ENABLE_STREAMS": "yes"}
    out = subprocess.run([sys.executable, "-m", "torch_neuronx.config"], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("TORCH_NEURONX_ENABLE_STREAMS "))
    assert "INVALID" in row and "only 0 and 1 are accepted" in row
