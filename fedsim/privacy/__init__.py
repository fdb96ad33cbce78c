"""Privacy of what leaves a client, torch-free: clipping and noise of the shared part's update (user-level DP,
central or local), the accountant (Google's dp-accounting, composed over the rounds a run really does), and
secure aggregation's pairwise masks on fixed-point uploads. docs/privacy.md says what is guaranteed to whom."""
