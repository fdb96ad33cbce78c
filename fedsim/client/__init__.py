from fedsim.client.module import OPTIMIZED_PARTS, FedClient

__all__ = ["OPTIMIZED_PARTS", "FedClient"]
