"""Workloads: what a user tunes (``Workload``, zero-argument factories), how a spec string finds one
(``load_workload``: a bundled name, ``module:function`` or ``path/to/file.py:function``), and the bundled examples,
which need no download (synthetic data, real training):

- ``cnn``: a small convolutional classifier on synthetic 32x32 images.
- ``transformer``: a tiny transformer language model on synthetic token sequences.
- ``tiny``: a two-layer MLP, for tests and smoke runs.

Importing this package imports no example and no torch: ``load_workload`` imports the one asked for.
"""
from __future__ import annotations

from ._flops import flop_per_sample
from ._workload import (
    Workload,
    call_user,
    default_name,
    held_out_sets,
    held_out_split,
    load_workload,
    output_tensors,
)

__all__ = ["Workload", "call_user", "default_name", "flop_per_sample", "held_out_sets", "held_out_split",
           "load_workload", "output_tensors"]
