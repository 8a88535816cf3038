"""``python -m torch_neuronx.profiling summarize DIR [--out OUT]``: top graphs, ops and transfers, and PNGs."""

from __future__ import annotations

import argparse
import sys

from torch_neuronx.profiling.summary import summarize


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m torch_neuronx.profiling",
                                     description="Reports on Neuron profiles written under torch.profiler.")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("summarize", help="top graphs, ops and transfers by time; timeline and bar PNGs")
    cmd.add_argument("directory", help="a profile directory (TORCH_NEURONX_PROFILE_OUTPUT_DIR or below) or trace file")
    cmd.add_argument("--out", default=None, help="where to write the PNGs (default: beside the trace)")
    args = parser.parse_args(argv)
    try:
        report, pngs = summarize(args.directory, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report)
    print("\n".join(f"wrote {p}" for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
