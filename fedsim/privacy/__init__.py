"""Privacy of what leaves a client, torch-free: clipping and noise of the shared part's update (user-level DP,
central or local), the accountant (Google's dp-accounting, composed over the rounds a run really does), and
secure aggregation's pairwise masks on fixed-point uploads. docs/privacy.md says what is guaranteed to whom."""

# The epsilon a run has spent by a round's end, as rounds.jsonl, W&B and `fedsim report` name it (values:
# fedsim.plan.RunPlan.privacy_at). Here, apart from the accountant, so reading them imports no dp-accounting.
EPSILON = "privacy/epsilon"  # central DP: the run's; local DP: the largest over the clients that may train
EPSILON_MEDIAN = "privacy/epsilon_median"  # local DP: the median client's
SPENT = (EPSILON, EPSILON_MEDIAN)
