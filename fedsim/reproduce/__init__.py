"""``fedsim reproduce PAPER``: the runs behind each of a paper's claims, their verdicts, REPRODUCTION.md. Each
paper is a folder of data under ``papers/`` (``paper_files``), listed in ``papers/index.yaml``."""
from fedsim.reproduce.paper_files import load_papers

PAPERS = load_papers()
