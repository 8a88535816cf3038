"""The job artifact tree of the compile path.

``{TORCH_NEURONX_DEBUG_DIR}/torch_neuronx/rank{RANK}/{job_id}/`` holds, per graph
``{model}_{ts}``: ``fx_graphs/*.fx.txt`` (the graph as traced), ``transformed_fx/
*.transformed.fx.txt`` (after our FX passes), ``raw/*.torch_raw.mlir``,
``stablehlo/*.stablehlo.mlir`` (``linalg/*.linalg.mlir`` for an eager op's
dynamic-shape kernel), ``torch_mlir_error/*.mlir`` (when torch-mlir fails)
and, with TORCH_NEURONX_DYNAMO_TENSOR_DUMPS, ``inputs/`` and ``outputs/``.

A graph's files are removed after its first execution unless
TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1; after a failure they are kept.
Tensor dumps, when asked for, are always kept.
"""

from __future__ import annotations

import datetime
import itertools
import os
import shutil
import threading
from collections.abc import Sequence

import torch

from torch_neuronx import config, process
from torch_neuronx.config import directories
from torch_neuronx.process import job_id

__all__ = ["GraphArtifacts", "job_dir", "job_id"]
_seq = itertools.count()
# Writes and the removal of emptied directories, from any thread: a graph's first call (on a
# stream's thread) removes its files while the next graph is being written.
_tree_lock = threading.Lock()


def job_dir() -> str:
    """``{TORCH_NEURONX_DEBUG_DIR}/torch_neuronx/rank{rank}/{job_id}``."""
    return process.rank_dir(os.path.join(directories.directory("TORCH_NEURONX_DEBUG_DIR"), "torch_neuronx"),
                            job_id())


class GraphArtifacts:
    """The artifact files of one compiled graph."""

    def __init__(self, model: str, preserve: bool | None = None) -> None:
        self.root = job_dir()
        self.stem = f"{model}_{datetime.datetime.now():%H%M%S%f}_{next(_seq)}"
        if preserve is None:
            preserve = bool(config.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"))
        self.preserve = preserve
        self.dumps = bool(config.get("TORCH_NEURONX_DYNAMO_TENSOR_DUMPS"))
        self._written: list[str] = []

    def _write(self, subdir: str, suffix: str, text: str) -> str:
        directory = os.path.join(self.root, subdir)
        path = os.path.join(directory, self.stem + suffix)
        with _tree_lock:
            os.makedirs(directory, exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        self._written.append(path)
        return path

    def fx_graph(self, gm: torch.fx.GraphModule) -> str:
        return self._write("fx_graphs", ".fx.txt", gm.print_readable(print_output=False))

    def transformed_fx(self, gm: torch.fx.GraphModule) -> str:
        return self._write("transformed_fx", ".transformed.fx.txt", gm.print_readable(print_output=False))

    def raw(self, text: str) -> str:
        return self._write("raw", ".torch_raw.mlir", text)

    def stablehlo(self, text: str) -> str:
        return self._write("stablehlo", ".stablehlo.mlir", text)

    def linalg(self, text: str) -> str:
        """The linalg-on-tensors module a dynamic-shape kernel compiles from (in place of StableHLO)."""
        return self._write("linalg", ".linalg.mlir", text)

    def torch_mlir_error(self, text: str) -> str:
        return self._write("torch_mlir_error", ".mlir", text)

    def dump_tensors(self, kind: str, call: int, tensors: Sequence[object]) -> str | None:
        """Save call number ``call``'s ``inputs`` or ``outputs`` when TORCH_NEURONX_DYNAMO_TENSOR_DUMPS is set."""
        if not self.dumps:
            return None
        directory = os.path.join(self.root, kind)
        path = os.path.join(directory, f"{self.stem}_call{call}.pt")
        with _tree_lock:
            os.makedirs(directory, exist_ok=True)
            torch.save([t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in tensors], path)
        return path

    def release(self) -> None:
        """Remove this graph's files after execution unless they are to be preserved."""
        if self.preserve:
            return
        with _tree_lock:
            for path in self._written:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            self._written.clear()
            _remove_empty_dirs(self.root)


def _remove_empty_dirs(root: str) -> None:
    if not os.path.isdir(root):
        return
    for sub in os.listdir(root):
        path = os.path.join(root, sub)
        if os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
    if not os.listdir(root):
        shutil.rmtree(root, ignore_errors=True)
