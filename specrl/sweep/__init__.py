"""``specrl sweep``: a grid of training runs on Ray Tune, each trained, exported in every
format and compared on held-out seeds, summarised over seeds.

* :mod:`specrl.sweep.spec`: the spec file (YAML or JSON) as a validated ``SweepSpec`` and its
  grid of ``Trial`` s.
* :mod:`specrl.sweep.trial`: ``run_trial``, one trial start to end, with no Ray in it.
* :mod:`specrl.sweep.tune`: ``run_sweep``, the trials as a Ray Tune grid search, resumable.
* :mod:`specrl.sweep.summary`: mean ± std over seeds per configuration, the failed trials,
  the best table per (profile, workload mix).

Ray and PyYAML (the ``[sweep]`` extra) are imported inside the functions that need them, so
importing this package does not import Ray.
"""
