"""The worker side: what runs inside a worker process (``python -m autotune.measure.worker SPEC.json``):
its arms, trained in windows, and their pairs of windows.
"""
