"""The compiler driver (compiler/driver.py) when the compiler itself dies."""

from __future__ import annotations

import threading
import time

import psutil

from torch_neuronx.compiler import driver, targets
from torch_neuronx.compiler.errors import NeuronCompileError

_T = "tensor<64x64xf32>"
# Many dependent dispatches: a compile that takes about a second, so a test can stop it midway.
_BODY = "\n".join(f"  %s{i} = stablehlo.sine %c{i} : {_T}\n"
                  f"  %c{i + 1} = stablehlo.dot %s{i}, %a : ({_T}, {_T}) -> {_T}" for i in range(150))
SLOW = f"func.func @main(%a: {_T}) -> {_T} {{\n  %c0 = stablehlo.cosine %a : {_T}\n{_BODY}\n  return %c150 : {_T}\n}}\n"


def test_a_compiler_killed_by_a_signal_is_named_in_the_error():
    """An aborted compiler (here: iree-compile killed while it compiles, in each attempt the driver
    makes with the target's fallback flags) fails the compile with the signal named; it read
    'iree exited with status -9'."""
    cpu = targets.cpu_target()
    errors: list[BaseException] = []

    def compile_slow() -> None:
        try:
            driver.compile_neff(driver.CompileJob(stablehlo=SLOW, target=cpu, flags=cpu.flags, key="9" * 64))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    thread = threading.Thread(target=compile_slow)
    thread.start()
    deadline, killed = time.monotonic() + 120, 0
    while thread.is_alive() and time.monotonic() < deadline:
        for process in psutil.Process().children():
            if any("iree-compile" in part for part in process.cmdline()):
                process.kill()
                killed += 1
        time.sleep(0.05)
    thread.join(timeout=10)
    assert killed and not thread.is_alive(), killed
    assert len(errors) == 1 and isinstance(errors[0], NeuronCompileError), errors
    assert "iree was killed by SIGKILL" in str(errors[0]), str(errors[0])
