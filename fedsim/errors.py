"""Errors the CLI turns into exit codes (kept free of heavy imports: `fedsim report` never loads Ray or torch)."""
from __future__ import annotations

import shlex
from pathlib import Path


class RunFailed(RuntimeError):
    """The run broke at run time (a process died, the disk filled up, a timeout): one line with the cause and
    the exact command that continues the run from its last checkpoint. The CLI exits with code 3."""

    def __init__(self, cause: str, run_dir: Path):
        self.resume_command = f"fedsim run --resume {shlex.quote(str(run_dir))}"
        super().__init__(f"run failed: {cause}; continue it with `{self.resume_command}`")
