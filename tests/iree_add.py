"""The tiny StableHLO module the cache tests compile with the real compiler."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ADD_MLIR = """\
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
IREE_FLAGS = ["--iree-input-type=stablehlo", "--iree-hal-target-device=local",
              "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]
CONFIG = {"target": "cpu", "flags": IREE_FLAGS}
IREE_COMPILE = os.path.join(os.path.dirname(sys.executable), "iree-compile")


def build(directory: pathlib.Path) -> pathlib.Path:
    """Write add.mlir into ``directory`` and compile it to add.vmfb; return the directory."""
    (directory / "add.mlir").write_text(ADD_MLIR)
    subprocess.run([IREE_COMPILE, str(directory / "add.mlir"), *IREE_FLAGS, "-o", str(directory / "add.vmfb")],
                   check=True)
    return directory
