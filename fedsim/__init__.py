"""fedsim: a personalized federated learning simulator (FedAvg, FedPer, FedBABU, ...) on Ray + Lightning."""
import os

from fedsim.lean_imports import lean_torchmetrics

# A local run (no RAY_ADDRESS) starts a single-node Ray cluster. Two settings keep it private, and Ray reads
# both when it is imported, hence here, before any fedsim module imports ray:
# - single-node mode (Ray's macOS/Windows default) binds the GCS, raylet, agent and worker ports to
#   127.0.0.1 instead of the machine's network address;
# - token authentication, said explicitly (Ray 2.59+ turns it on for new local clusters anyway, with a
#   warning that suggests turning it off); Ray writes the token to ~/.ray/auth_token on first use.
# A process attached to a cluster keeps Ray's defaults and the cluster's token; a user's own values win.
if not os.environ.get("RAY_ADDRESS"):
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")

# Every fedsim process that trains imports torchmetrics through Lightning: without its optional integrations
# (torchvision's models, transformers, ...) it loads in under half the time (fedsim/lean_imports.py).
lean_torchmetrics()

__version__ = "0.1.0"
