"""Process identity (rank, local rank, world size, job id, per-rank directories) and visible devices."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from torch_neuronx import config, process


def test_identity_defaults_outside_torchrun(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert (process.rank(), process.local_rank(), process.world_size()) == (0, 0, 1)
    assert not process.is_distributed()


def test_identity_from_torchruns_variables(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (process.rank(), process.local_rank(), process.world_size()) == (3, 1, 4)
    assert process.is_distributed()
    assert process.rank_dir("/shared", "job") == os.path.join("/shared", "rank3", "job")


def test_identity_from_an_initialized_process_group(tmp_path):
    code = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
        "from torch_neuronx import process\n"
        "print(process.rank(), process.world_size())\n"
        "dist.destroy_process_group()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["WORLD_SIZE"] = "7"  # torch.distributed's own value wins once it is initialized
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]


def test_job_id_is_fixed_and_names_time_and_pid():
    job = process.job_id()
    assert job == process.job_id()
    assert re.fullmatch(rf"\d{{8}}_\d{{6}}_{os.getpid()}", job)


@pytest.mark.parametrize(("raw", "count"), [("", 1), ("1", 1), ("4", 4), ("0,1", 2), ("0-3", 4), ("2,5-6", 3),
                                            ("128", 128)])
def test_visible_devices(raw, count, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_VISIBLE_DEVICES", raw)
    assert process.device_count() == count


@pytest.mark.parametrize("raw", ["0", "a", "1-", "3-1", "0,0", "-1", "129", "0-200"])  # 129+: past int8 indices
def test_bad_visible_devices_warn_and_use_one_device(raw, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_NEURONX_VISIBLE_DEVICES", raw)
    assert process.device_count() == 1
    assert "TORCH_NEURONX_VISIBLE_DEVICES" in caplog.text


def test_device_index_range_is_checked():
    with config.override(TORCH_NEURONX_VISIBLE_DEVICES=(0, 1)):
        assert process.checked_device_index("neuron:1") == 1
        with pytest.raises(ValueError, match="device_count\\(\\) is 2"):
            process.checked_device_index(2)


def test_a_forked_child_runs_neuron_work_and_exits(tmp_path):
    """A child forked after neuron ops hung forever: a kernel compiled on the parent's compile
    thread (not in the child), and its exit waited for the runtime's threads in finalization. The
    child now compiles its own kernels, runs compiled graphs, exits, and does not overwrite the
    parent's metric tables."""
    program = (
        "import os, sys, faulthandler, torch, torch_neuronx\n"
        "x = torch.randn(8, 8).to('neuron'); (x + 1).cpu()\n"
        "f = torch.compile(lambda a: a.sin() * 2, backend='neuron'); a = torch.randn(64, 64); f(a)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    faulthandler.dump_traceback_later(60, exit=True)\n"
        "    print('CHILD', torch.allclose((x * 3).cpu(), x.cpu() * 3), torch.allclose(f(a), a.sin() * 2),\n"
        "          torch.equal(torch.ones(2).to('neuron').cpu(), torch.ones(2)), flush=True)\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('STATUS', status)\n"
        "print('PARENT', torch.allclose((x - 1).cpu(), x.cpu() - 1))\n")
    env = {**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "eager_ops", "TORCH_NEURONX_METRICS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHILD True True True" in proc.stdout and "STATUS 0" in proc.stdout and "PARENT True" in proc.stdout, \
        (proc.stdout, proc.stderr[-3000:])
    table = (tmp_path / "metric_table_eager_ops_rank0.csv").read_text()
    assert "sub.Tensor" in table  # the parent's tables, not the child's
