"""A disk cache of log p(K), shared by queries, runs and processes.

Entries are keyed by a hash of the passage's token ids, in a folder per teacher setting
(weights, dtype, start token). Writers add whole segment files atomically (write, then
rename), so concurrent processes never see a partial file and a killed run loses at most
the segment it was writing.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def passage_key(ids: Sequence[int]) -> str:
    """Content hash of a passage's token ids."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:32]


class PassageLogProbCache:
    """``key -> log p(K)`` (float, nats) for one teacher setting, stored under ``root``."""

    def __init__(self, root: str | Path, setting: dict[str, Any]) -> None:
        digest = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:16]
        self.dir = Path(root) / digest
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "setting.json").write_text(json.dumps(setting, indent=2, sort_keys=True))
        self._values: dict[str, float] = {}
        self.reload()

    def reload(self) -> None:
        """Read every segment written so far, by this process or others."""
        for segment in sorted(self.dir.glob("seg-*.jsonl")):
            with segment.open() as f:
                for line in f:
                    key, value = json.loads(line)
                    self._values[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def __getitem__(self, key: str) -> float:
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def add(self, keys: Sequence[str], values: Sequence[float]) -> None:
        """Store entries as one new segment file."""
        if not keys:
            return
        tmp = self.dir / f".tmp-{uuid.uuid4().hex}"
        with tmp.open("w") as f:
            for key, value in zip(keys, values, strict=True):
                f.write(json.dumps([key, float(value)]) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(self.dir / f"seg-{uuid.uuid4().hex}.jsonl")
        self._values.update(zip(keys, map(float, values), strict=True))
