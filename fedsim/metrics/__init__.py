from fedsim.metrics.summary import summarize

__all__ = ["summarize"]
