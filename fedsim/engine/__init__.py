"""The Ray engine: the server actor (``server``), the driver loop and its callbacks (``driver``), the run
folder (``runfolder``), one simulation from config to finished folder (``session``), worker placement and
``--dry-run``'s estimate. It imports nothing of the client layer: workers are started through the spawn
function it is given (``fedsim.simulate`` passes ``fedsim.client.worker.spawn_worker``)."""
