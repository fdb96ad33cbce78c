"""Ctrl-C and SIGTERM: SIGTERM raised as an exception so a run unwinds as on Ctrl-C, and either one, during a
run, turned into one line naming the ``--resume`` command that continues it."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


def _signal_in(err: BaseException | None) -> BaseException | None:
    """The KeyboardInterrupt or Terminated that ``err`` is or was caused by: raised while the main thread was inside
    Ray's C++ code (Tune's wait for its trials), it comes out as a SystemError whose cause it is."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, (KeyboardInterrupt, Terminated)):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def interrupts_continued(command: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM during a sweep or a tuning become one line naming ``command``, which continues it (finished
    runs are not retrained, stopped ones resume from their checkpoints); exit 130 or 143."""
    try:
        yield
    except (KeyboardInterrupt, Terminated, SystemError) as err:
        signalled = _signal_in(err)
        if signalled is None:
            raise
        raise Interrupted("", command, 143 if isinstance(signalled, Terminated) else 130) from None

