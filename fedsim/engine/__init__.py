"""The engine: the server (``server``; a Ray actor, or on the local backend an object in the driver's process:
``backend``), how it reduces a round's uploads (``reduction``) and what it holds between rounds
(``server_state``), with its worker pool (``pool``) and FedBuff's asynchronous step (``fedbuff``), the driver loop
and its callbacks (``driver``), the run folder (``runfolder``, its checks before Ray ``runfolder_checks``, its lock
``runlock``), Ray's start-up and token (``ray_cluster``), one simulation from config to finished folder
(``session``), worker placement and ``--dry-run``'s estimate. It imports nothing of the client layer: workers are
started through the ``backend.Workers`` it is given (``fedsim.simulate`` passes ``fedsim.client.worker``'s actor
spawn and its Worker class)."""
