from fedsim.algorithms.spec import Algorithm

LG_FEDAVG = Algorithm("lg_fedavg", train="full", share="head",
                      summary="local representation, global head: only the head is averaged (Liang et al. 2020)")
