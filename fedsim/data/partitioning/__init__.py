"""Drawing a client partition: ``make.make_partition`` checks the arguments and dispatches to a kind
(``kinds``), each kind a function of a ``request.Request``.

A partition is a pure function of (labels, arguments, seed): all randomness comes from one
``np.random.default_rng(seed)``, so a run can be reproduced, or its partition cached, exactly.
"""
