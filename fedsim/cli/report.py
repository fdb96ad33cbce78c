"""``fedsim report RUN_DIR ...``: plots and a Markdown table from run folders (local or in a bucket)."""
from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path


def report_command(args: argparse.Namespace) -> int:
    from fedsim import storage
    from fedsim.core import runfiles
    from fedsim.metrics.report import write_report

    with ExitStack() as stack:  # run folders in a bucket are read from a temporary local copy
        runs = [stack.enter_context(storage.local_folder(run, skip=runfiles.CHECKPOINTS)) for run in args.runs]
        for path in write_report(runs, Path(args.out)):
            print(path)
    return 0
