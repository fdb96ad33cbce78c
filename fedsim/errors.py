"""Every user-facing error type and the exit code the CLI turns it into. Kept free of heavy imports: `fedsim report`
never loads Ray or torch."""
from __future__ import annotations

import errno
import shlex
from pathlib import Path


class ConfigError(ValueError):
    """A one-line, user-facing configuration problem (names the field and the fix); the CLI exits with code 2."""


def resume_command(run_dir: Path | str, names_code: bool) -> str:
    """The command that continues the run in ``run_dir``. ``names_code``: its config names plug-ins (its own
    module, callbacks), which resume imports only with --trust-plugins: the command printed must work as printed."""
    return f"fedsim run --resume {shlex.quote(str(run_dir))}" + (" --trust-plugins" if names_code else "")


class RunFailed(RuntimeError):
    """The run broke at run time (a process died, the disk filled up, a timeout): one line with the cause and
    the exact command that continues the run from its last checkpoint. The CLI exits with code 3.
    ``resumable=False``: it broke while creating its folder, so it is started again instead."""

    def __init__(self, cause: str, run_dir: Path | str, resumable: bool = True, names_code: bool = False):
        self.resume_command = resume_command(run_dir, names_code) if resumable else None
        then = (f"continue it with `{self.resume_command}`" if resumable
                else f"its folder {run_dir} is incomplete: start the run again with --overwrite")
        super().__init__(f"run failed: {cause}; {then}")


class RayUnavailable(RuntimeError):
    """Ray did not start, or the cluster did not answer, within the time fedsim waits: one line naming what it
    waited for; the CLI exits with code 3. Nothing of the run was written yet."""


class TuningIncomplete(RuntimeError):
    """``fedsim tune`` cannot choose a method's settings (every trial of it failed) or finish (another process holds
    some of its runs): one line with the cause; the CLI exits with code 3 and a rerun continues."""


class DataError(ValueError):
    """A data setting is wrong or the data on disk is unusable: one line naming the setting (e.g. ``data.root``)
    and how to fix it, which the CLI prints as is (exit 2) instead of a traceback."""


class CheckpointError(ValueError):
    """A missing, truncated or foreign checkpoint (one line naming the file and the fix); the CLI exits with code 2."""


class UserCodeError(ValueError):
    """The user's own module (model.client) raised, or broke a rule fedsim enforces: one line with its own
    message, reported once as a user error (exit 2), never retried as a lost worker."""


class UserCodeFailed(UserCodeError):
    """The user's own code raised once the run was under way, so its folder was written: one line with the error,
    what the folder holds and the command that continues it once the code is fixed; the CLI exits with code 4
    (code 2 means nothing was written)."""


class StorageError(OSError):
    """A run location that cannot be reached (one line naming out_dir and the fix)."""


class DiskFull(OSError):
    """A write ran out of disk space: one line naming the disk (a path on it), what the write needed and what was
    free, never the raw "N requested and M written" of a short write."""

    def __init__(self, path: Path | str, needed: int, free: int):
        super().__init__(errno.ENOSPC, f"the disk holding {path} is full: writing it needed {_size(needed)}, "
                                       f"{_size(free)} were free; free space there or write elsewhere")

    def __str__(self) -> str:
        return str(self.strerror)


def _size(count: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"


class PluginError(ValueError):
    """A ``package.module:name`` that cannot be imported (one line naming the field and the fix)."""


class YamlError(ValueError):
    """Not acceptable YAML: one line, saying where (line number) and why, never quoting the input."""


class ResultsDamaged(ValueError):
    """A result file of a run folder holds a line that is not a row: resume would lose what follows it."""


class TrainingDiverged(ValueError):
    """A client's loss became NaN/Inf and train.on_nonfinite is 'stop'."""


def user_error(err: BaseException | None) -> UserCodeError | None:
    """The UserCodeError inside ``err``, also through the RayTaskError wrapper of each actor it crossed (Ray's
    wrapper subclasses the original's class; its ``cause`` is the original)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if type(err) is UserCodeError:
            return err
        err = getattr(err, "cause", None) or err.__cause__
    return None
