"""A method's own server state (Algorithm.server_state) is checkpointed with the run and checked on resume: a
checkpoint is input, so an edited server.npz is refused instead of changing what the run computes."""
import numpy as np
import pytest
from conftest import in_process_server, six_client_run

from fedsim.errors import CheckpointError


def test_a_server_state_of_another_shape_is_refused(tmp_path, data_root, monkeypatch):
    server = in_process_server(six_client_run(tmp_path, data_root, "scaffold", 2))
    server.restore(None)
    server.round(1)
    ckpt = server.checkpoint(str(tmp_path / "run"), 1)
    path = f"{ckpt}/server.npz"
    with np.load(path) as z:
        state = {k: z[k] for k in z.files}
    state["control"] = state["control"][:-1]
    np.savez(path, **state)
    resumed = in_process_server(six_client_run(tmp_path, data_root, "scaffold", 2))
    with pytest.raises(CheckpointError, match="server state 'control'"):
        resumed.held.load(ckpt)
