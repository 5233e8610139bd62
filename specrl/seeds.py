"""The seed plan: where each job's episodes start, so that no two jobs replay one stream.

Training env ``i`` is reset from seed ``i`` (0..n_envs-1) and draws its later episodes from
that stream. Every other job resets its episode ``j`` with ``BASE + j`` from its own base
below; the bases lie 10,000 apart, more episodes than any job plays.
"""

EVAL_SEED = 10_000
"""Training's periodic evaluation (``TrainConfig.eval_seed``)."""
HELD_OUT_SEED = 20_000
"""Held-out comparisons: ``specrl demo``, the experiments, and the export's fidelity check."""
WARM_START_SEED = 30_000
"""The warm start's teacher episodes."""
VISIT_SEED = 40_000
"""The export's count of the cells a policy visits (apart from the fidelity check's)."""
TUNE_SEED = 50_000
"""Tuning the engineer's baselines (``threshold:tuned``, ``sweep``) and the schedule search."""
CONFIRM_SEED = 55_000
"""Confirming the native table search's moves on episodes apart from the tuning seeds that
chose them (:mod:`specrl.train.table_search`)."""
