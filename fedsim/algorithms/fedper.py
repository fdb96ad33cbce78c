from fedsim.algorithms.spec import Algorithm

FEDPER = Algorithm("fedper", train="full", share="body",
                   summary="base averaged, personal layers never leave the client (Arivazhagan et al. 2019)")
