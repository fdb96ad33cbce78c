from fedsim.algorithms.spec import Algorithm

FEDBABU = Algorithm("fedbabu", train="body", share="body", orthogonal_head=True,
                    summary="body trained and averaged under a fixed orthogonal head; head tuned at evaluation (Oh et al. 2021)")
