"""The ground floor: data schema and loaders, the model resolver, batching, runs, metrics and configs.

It imports nothing of ``teachers``, ``students``, ``distill.serving``, ``distill.export``, ``distill.stages``,
the CLI or the pipeline (``tests/e2e/test_layers.py`` checks it), so every other layer can stand on it.
"""
