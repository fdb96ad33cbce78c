"""The client layer: a worker's runtime (many virtual clients in one model), the LightningModule each client
trains through, and the Ray actor shell that hosts a runtime. Importing this package imports no torch:
``FedClient`` loads on first use."""

__all__ = ["OPTIMIZED_PARTS", "FedClient"]


def __getattr__(name: str):
    if name in __all__:
        from fedsim.client import module

        return getattr(module, name)
    raise AttributeError(f"module 'fedsim.client' has no attribute {name!r}")
