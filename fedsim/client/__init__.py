"""The client layer: a worker's runtime (many virtual clients in one LightningModule, driven as Lightning drives
it) and the Ray actor shell that hosts a runtime. Importing this package imports no torch: ``FedClient`` (the
built-in module, defined in ``fedsim.models.lightning``) loads on first use."""

__all__ = ["FedClient"]


def __getattr__(name: str):
    if name == "FedClient":
        from fedsim.models.lightning import FedClient

        return FedClient
    raise AttributeError(f"module 'fedsim.client' has no attribute {name!r}")
