"""The torch-free core under every other layer: what the server and the workers send each other
(``protocol``), exact aggregation (``aggregate``), flat-vector layouts (``layout``), the per-client state
store (``store``), the checkpoint format (``checkpoint``), the run's schedule (``plan``) and the release of
shared-memory pages a process is done with (``pages``). The server's process imports only this layer, the
algorithms' server hooks and Ray: it is up in well under a second."""
