"""Learned pairwise interference (Co-scheML, ALGORITHMS.md §2; thesis 003 chapter III).

Pure Python + pandas + scikit-learn; no Django, Celery or Redis.

- ``features``: the per-job profile vector (Table 1 metrics, a cheap profile, the GPU), its
  min-max normalisation (``FeatureSpace``).
- ``datasets``: training samples from real measurements: nvprof kernel metrics joined with the
  TensorFlow co-location runs, and the PyTorch job types of ``colocation.csv`` with a cheap
  profile (GPU speed ratios, batch size, co-runs with three reference jobs); plus live co-runs.
- ``training``: linear regression, decision tree, random forest and gradient boosting; 5-fold
  cross-validation, 5-fold with whole pairs held out, leave-one-application-out; MSE, R^2, MAE.
- ``predictor``: the trained artifact the scheduler uses (``InterferencePredictor``), with a
  prediction cache per profile pair, and its (de)serialisation.
- ``runtime``: which predictor a policy gets: the portal's active model (through a provider the
  portal registers), a file, or the built-in model trained from the shipped data.
- ``interference``: ``LearnedInterference``, the predictor as a registered interference model
  (``learned``).
- ``evaluate``: the command line that prints the figures of docs/coscheml.md.
"""
