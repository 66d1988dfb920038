"""CUDA-event timing shared by the PyTorch peer scripts (torch_peers.py, torch_prefill_peers.py).

They are run as `python3 bench/<script>.py`, so this directory is on sys.path and a plain
`import torch_timing` finds this file.
"""
import statistics

import torch


def median_ms(fn, reps, warmup):
    """Median ms of `reps` calls fn(i), i = 0 .. reps - 1, after `warmup` untimed calls.

    Each call is bracketed by CUDA events on the current stream; all reps are queued before one
    synchronisation, so host launch gaps between reps stay out of the times.
    """
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i)
        stops[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops))
