"""Ctrl-C and SIGTERM: SIGTERM raised as an exception so a run unwinds as on Ctrl-C, and either one, during a
run, turned into one line naming the ``--resume`` command that continues it."""
from __future__ import annotations

import contextlib
from pathlib import Path


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so the run unwinds as on Ctrl-C (its lock released, Ray shut down)."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM: one line with the command that continues it (or, stopped before its
    folder was written, saying so); exit 130 or 143."""

    def __init__(self, location: str, command: str, exit_code: int, written: bool = True):
        self.exit_code = exit_code
        super().__init__(f"interrupted; continue with `{command}`" if written else
                         f"interrupted before the run started; nothing was written to {location}")


@contextlib.contextmanager
def interrupts_named(cfg):
    """Ctrl-C or SIGTERM during ``cfg``'s run become one line naming how to continue it (the run keeps its
    checkpoints: the rounds since the last one are redone)."""
    from fedsim import storage
    from fedsim.core.runfiles import CONFIG
    from fedsim.errors import resume_command
    from fedsim.plugins import names_code

    try:
        yield
    except (KeyboardInterrupt, Terminated) as err:
        location = storage.join(cfg.out_dir, cfg.name)
        # A run folder is written from its config on (before Ray starts, nothing is); a bucket is not looked into.
        written = storage.is_uri(location) or (Path(location) / CONFIG).exists()
        raise Interrupted(location, resume_command(location, names_code(cfg)),
                          143 if isinstance(err, Terminated) else 130, written) from None
