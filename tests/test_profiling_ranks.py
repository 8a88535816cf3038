"""Two ranks under torchrun: only the ranks TORCH_NEURONX_PROFILE_RANKS lists write a profile."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiling_ranks.py")


def test_two_ranks_write_only_the_listed_rank(tmp_path):
    out = tmp_path / "profiles"
    env = {**os.environ, "TORCH_NEURONX_PROFILE_OUTPUT_DIR": str(out), "TORCH_NEURONX_PROFILE_RANKS": "1",
           "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCH_NEURONX_PROFILE_MODES"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = glob.glob(str(out / "*_pid_*" / "*" / "trace.json"))
    assert len(traces) == 1, (traces, done.stdout)
    with open(traces[0]) as f:
        assert json.load(f)["neuron"]["rank"] == 1
    assert len(glob.glob(str(out / "*_pid_*"))) == 1
    assert done.stdout.count("exported []") == 1  # rank 0 exported nothing
