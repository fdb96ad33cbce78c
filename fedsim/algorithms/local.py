from fedsim.algorithms.spec import Algorithm

LOCAL = Algorithm("local", train="full", share="none", summary="each client trains alone; nothing is shared")
