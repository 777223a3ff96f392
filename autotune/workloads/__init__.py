"""Bundled example workloads that need no download: synthetic data, real training.

- ``cnn``: a small convolutional classifier on synthetic 32x32 images.
- ``transformer``: a tiny transformer language model on synthetic token sequences.
- ``tiny``: a two-layer MLP, for tests and smoke runs.
"""
