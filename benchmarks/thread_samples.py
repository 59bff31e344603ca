"""Where each thread of a process spends its time: a sampler that any Python process starts at interpreter start-up
(through ``benchmarks/thread_sampling/sitecustomize.py`` on ``PYTHONPATH``, with ``CIS_THREAD_SAMPLES`` naming a
folder), and a summary of what it wrote.

Every ``CIS_THREAD_SAMPLE_MS`` milliseconds (default 1) the sampler reads every thread's current frame
(``sys._current_frames``) and counts, per :data:`BUCKET` of time and thread name, its stack (the innermost
:data:`DEPTH` frames, as ``file:function`` from the outermost down). It writes the counts to ``<folder>/<pid>.json``
every few seconds and at exit. A thread that waits for the GIL shows the frame it waits in, so the samples tell where
a thread is, not what the processor runs; the sampler takes the GIL for each sample, so it slows the process a little.

The summary counts, by default, only the buckets in which some thread was in a frame of ``http_api.py`` (a server
handling requests), so that a server's start-up and idle time between the load benchmark's cells stay out of it;
``--marker`` names another file (``http11.py``: an httpx client sending requests), ``--everything`` counts every
bucket.

    CIS_THREAD_SAMPLES=out/samples PYTHONPATH=benchmarks/thread_sampling:$PYTHONPATH python -m benchmarks.load run ...
    python -m benchmarks.thread_samples out/samples [--thread rerank-batcher] [--within batcher.py] [--top 15]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

DEPTH = 48
"""Frames kept of each stack, innermost first."""
BUCKET = 0.1
"""Seconds of one bucket of counts."""
WRITE_EVERY = 5.0
"""Seconds between two writes of the counts."""
SERVING = "http_api.py"
"""A frame of this file in some thread marks a bucket in which a server was handling requests."""


def _stack(frame) -> str:
    names = []
    while frame is not None and len(names) < DEPTH:
        code = frame.f_code
        names.append(f"{Path(code.co_filename).name}:{code.co_name}")
        frame = frame.f_back
    return ";".join(reversed(names))


def start(folder: str, interval: float) -> None:
    """Sample this process's threads every ``interval`` seconds into ``folder``/<pid>.json, from now to its exit."""
    counts: Counter[tuple[int, str, str]] = Counter()
    """(bucket, thread name, stack) -> samples."""
    lock = threading.Lock()
    path = Path(folder) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def write() -> None:
        with lock:
            rows = [[*key, count] for key, count in counts.items()]
        record = {"argv": sys.argv, "seconds": time.monotonic() - started, "interval": interval, "bucket": BUCKET}
        path.write_text(json.dumps({**record, "counts": rows}))

    def sample() -> None:
        me = threading.get_ident()
        written = time.monotonic()
        while True:
            time.sleep(interval)
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            frames = sys._current_frames()
            bucket = int((time.monotonic() - started) / BUCKET)
            with lock:
                for ident, frame in frames.items():
                    if ident != me:
                        counts[bucket, names.get(ident, str(ident)), _stack(frame)] += 1
            if time.monotonic() - written > WRITE_EVERY:
                write()
                written = time.monotonic()

    threading.Thread(target=sample, name="thread-sampler", daemon=True).start()
    atexit.register(write)


def _key(stack: str, within: str | None) -> str:
    """The last three frames of ``stack``; with ``within`` (a file name), from its innermost frame in that file."""
    frames = stack.split(";")
    if within is not None:
        inside = [i for i, frame in enumerate(frames) if frame.startswith(f"{within}:")]
        if inside:
            return ";".join(frames[inside[-1] : inside[-1] + 3])
    return ";".join(frames[-3:])


def summary(
    folder: Path,
    thread: str | None,
    top: int,
    within: str | None = None,
    everything: bool = False,
    marker: str = SERVING,
) -> str:
    """Per process and thread: its samples, and the ``top`` stacks it was seen in most, each as its last three frames
    (or, with ``within`` a file name, three frames from its innermost frame in that file); only in the buckets in
    which some thread was in a frame of ``marker`` (by default :data:`SERVING`) unless ``everything``.

    Raises:
        FileNotFoundError: ``folder`` holds no samples.
    """
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"{folder}: no samples (<pid>.json): was CIS_THREAD_SAMPLES set to it?")
    lines = []
    for path in paths:
        record = json.loads(path.read_text())
        serving = {bucket for bucket, _, stack, _ in record["counts"] if f"{marker}:" in stack}
        rows = [row for row in record["counts"] if everything or row[0] in serving]
        window = record["seconds"] if everything else len(serving) * record["bucket"]
        command = " ".join(record["argv"])[:100]
        lines.append(f"# {path.name}: {command}")
        counted = "in all" if everything else f"in {marker}"
        lines.append(f"  {window:.1f} s {counted}, a sample every {record['interval'] * 1e3:g} ms")
        threads: dict[str, Counter[str]] = {}
        for _, name, stack, count in rows:
            if thread is None or name.startswith(thread):
                threads.setdefault(name, Counter())[_key(stack, within)] += count
        for name, stacks in sorted(threads.items(), key=lambda item: -item[1].total()):
            total = stacks.total()
            lines.append(f"## {name}: {total} samples")
            for stack, count in stacks.most_common(top):
                lines.append(f"  {100 * count / total:5.1f}%  {stack}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the folder CIS_THREAD_SAMPLES named")
    parser.add_argument("--thread", help="only the threads whose name starts with this")
    parser.add_argument("--top", type=int, default=12, help="stacks shown per thread")
    parser.add_argument("--within", help="show stacks from their innermost frame in this file (batcher.py)")
    parser.add_argument("--everything", action="store_true", help="count every bucket, not only the marker's")
    parser.add_argument("--marker", default=SERVING, help="count the buckets with a frame of this file in a thread")
    args = parser.parse_args(argv)
    try:
        print(summary(args.folder, args.thread, args.top, args.within, args.everything, args.marker))
    except FileNotFoundError as e:
        sys.exit(f"thread_samples: {e}")


if __name__ == "__main__":
    main()
