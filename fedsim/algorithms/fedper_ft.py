from fedsim.algorithms.spec import Algorithm

FEDPER_FT = Algorithm("fedper_ft", train="full", share="body", head_first=True,
                      summary="FedPer with local pre-fine-tuning: head alone on the new base first (FedPer paper, Knowl 8)")
