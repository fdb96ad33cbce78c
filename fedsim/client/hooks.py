"""The module's own code and its callbacks', called as Lightning calls them; what they raise is reported as the
user's, naming the module, the hook and the client at work."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch

from fedsim.errors import UserCodeError
from fedsim.models.lightning import overrides

HOOKS = ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_before_backward",
         "on_after_backward", "on_before_optimizer_step", "on_train_batch_end", "on_train_epoch_end", "on_train_end",
         "on_fit_end", "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
         "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_test_start",
         "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end", "on_test_epoch_end", "on_test_end")


class UserCode:
    """A module's hooks (its own overrides, then each callback's) and a guard around every call of its code."""

    def __init__(self, module: pl.LightningModule, callbacks: list[pl.Callback]):
        self.module = module
        self.name = type(module).__name__
        self.hooks = {name: self._bound(name, callbacks) for name in HOOKS}
        self.where = ""  # the client and round at work, for error messages

    def _bound(self, hook: str, callbacks: list[pl.Callback]) -> list[Callable]:
        """The module's own override of ``hook`` and each callback's, as Lightning calls them (a callback gets the
        trainer, which for a Fabric-driven module is its Fabric, and the module first)."""
        own = [getattr(self.module, hook)] if overrides(self.module, hook) else []
        trainer = self.module.trainer
        return own + [(lambda *a, cb=cb: getattr(cb, hook)(trainer, self.module, *a)) for cb in callbacks
                      if getattr(type(cb), hook, None) is not getattr(pl.Callback, hook, None)]

    def run(self, what: str, fn: Callable, *args: Any) -> Any:
        """``fn(*args)``, user code: what it raises (but fedsim's own errors and running out of memory) becomes a
        one-line UserCodeError."""
        try:
            return fn(*args)
        except (UserCodeError, torch.OutOfMemoryError):
            raise
        except Exception as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
            raise UserCodeError(f"model.client: {self.name}.{what} raised {type(err).__name__}: {message}"
                                f"{self.where}; fix the module") from None

    def call(self, hook: str, *args: Any) -> None:
        """Lightning's ``hook``: the module's override and every callback's."""
        for fn in self.hooks[hook]:
            self.run(hook, fn, *args)
