from fedsim.algorithms.spec import Algorithm

FEDAVG = Algorithm("fedavg", train="full", share="full", summary="one global model (McMahan et al. 2017)")
