"""fedsim: a personalized federated learning simulator (FedAvg, FedPer, FedBABU, ...) on Ray + Lightning."""

__version__ = "0.1.0"
