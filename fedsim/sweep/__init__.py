"""Many runs at once: a config's sweep (or a paper's runs) as Ray Tune trials on the current Ray cluster, each run
brought to completion from what its folder holds (``runs``), one trial per run (``trial``), scheduled and
reported by ``executor``; ``tune``: methods tuned at equal budgets on those sweeps, chosen on validation."""
