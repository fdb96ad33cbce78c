from fedsim.algorithms.spec import Algorithm

DITTO = Algorithm("ditto", train="full", share="full", personal_model=True,
                  summary="FedAvg global model + a personal model regularised toward it by lambda (Li et al. 2021)")
