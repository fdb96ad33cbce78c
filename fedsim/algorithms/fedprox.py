from fedsim.algorithms.spec import Algorithm

FEDPROX = Algorithm("fedprox", train="full", share="full", proximal=True,
                    summary="FedAvg + proximal term mu/2 ||w - w_global||^2 (Li et al. 2020)")
FEDPROX_BABU = Algorithm("fedprox_babu", train="body", share="body", orthogonal_head=True, proximal=True,
                         summary="FedProx on the body under FedBABU's fixed orthogonal head (FedBABU paper, App. M)")
