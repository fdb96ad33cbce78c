"""Ctrl-C and SIGTERM: SIGTERM raised as an exception so a run unwinds as on Ctrl-C, and either one, during a
run, turned into one line naming the ``--resume`` command that continues it."""
from __future__ import annotations

import contextlib


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so the run unwinds as on Ctrl-C (its lock released, Ray shut down)."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM: one line with the command that continues it; exit 130 or 143."""

    def __init__(self, command: str, exit_code: int):
        self.exit_code = exit_code
        super().__init__(f"interrupted; continue with `{command}`")


@contextlib.contextmanager
def interrupts_named(cfg):
    """Ctrl-C or SIGTERM during ``cfg``'s run become one line naming how to continue it (the run keeps its
    checkpoints: the rounds since the last one are redone)."""
    from fedsim import storage
    from fedsim.errors import resume_command
    from fedsim.plugins import names_code

    try:
        yield
    except (KeyboardInterrupt, Terminated) as err:
        command = resume_command(storage.join(cfg.out_dir, cfg.name), names_code(cfg))
        raise Interrupted(command, 143 if isinstance(err, Terminated) else 130) from None
