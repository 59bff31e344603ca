"""The stages: functions that the CLI and the pipeline both call, each taking a typed config and returning a
typed report (teach, train, export, evaluate, rerank, retrieve, bench)."""
