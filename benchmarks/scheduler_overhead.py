"""What the runtime's scheduler costs per request, for each discipline, in one run.

    .venv/bin/python benchmarks/scheduler_overhead.py [--models 20] [--requests 20000]

Pure Python, no server: ``--models`` models (compiled sizes 1, 2, 4, 8) each get requests of
one row in turn; one ``next()`` + ``record()`` follows every second ``submit()``, so queues
stay short and batches small, as under a closed-loop load. Prints, per discipline, the time
per request (submit plus its share of next/record, microseconds), the mean executed batch
size, and the ratio to ``fifo`` (the cheapest choice). The machine is noisy (shared cores):
read the ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import time

from hloserve.triton_backend.runtime.scheduler import Scheduler, SchedulerConfig, Work


def per_request_us(discipline: str, models: int, requests: int) -> tuple[float, float]:
    """(microseconds per request, mean batch size) of one pass."""
    scheduler = Scheduler(SchedulerConfig(discipline=discipline), lambda work, reason: None)  # type: ignore[arg-type]
    for m in range(models):
        scheduler.register(f"m{m}", 0, [1, 2, 4, 8])
    batches = 0
    start = time.perf_counter()
    for i in range(requests):
        scheduler.submit(Work(f"m{i % models}", 0, 1, None))
        if i % 2:
            batch = scheduler.next(0)
            assert batch is not None
            scheduler.record(batch, 0.001)
            batches += 1
    while (batch := scheduler.next(0)) is not None:
        scheduler.record(batch, 0.001)
        batches += 1
    elapsed = time.perf_counter() - start
    return elapsed / requests * 1e6, requests / batches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    results = {}
    for discipline in ("fifo", "edf", "fair"):
        runs = [per_request_us(discipline, args.models, args.requests) for _ in range(3)]
        results[discipline] = (min(r[0] for r in runs), runs[0][1])
    base = results["fifo"][0]
    for discipline, (us, mean_batch) in results.items():
        print(
            f"{discipline:5s} {us:6.1f} us/request  mean batch {mean_batch:.2f}  "
            f"x{us / base:.2f} of fifo"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
