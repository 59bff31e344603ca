"""Starts :mod:`benchmarks.thread_samples`' sampler in every Python process that has this folder on ``PYTHONPATH``
and ``CIS_THREAD_SAMPLES`` set (the folder its counts go to)."""

import os

if os.environ.get("CIS_THREAD_SAMPLES"):
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location("thread_samples", Path(__file__).parents[1] / "thread_samples.py")
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.start(os.environ["CIS_THREAD_SAMPLES"], float(os.environ.get("CIS_THREAD_SAMPLE_MS", "1")) / 1e3)
