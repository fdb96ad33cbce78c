from fedsim.algorithms.spec import Algorithm

FEDREP = Algorithm("fedrep", train="body", share="body", head_first=True,
                   summary="head epochs on the received body, then body epochs; body shared (Collins et al. 2021)")
