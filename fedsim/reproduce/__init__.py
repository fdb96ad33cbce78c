"""``fedsim reproduce PAPER``: the runs behind each of a paper's claims, their verdicts, REPRODUCTION.md."""
from fedsim.reproduce import fedbabu, fedper

PAPERS = {paper.key: paper for paper in (fedper.PAPER, fedbabu.PAPER)}
