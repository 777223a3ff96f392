"""Model transforms of the ``sparsity`` knob family (installed as ``autotune.search_spaces.transforms``).

They change the user's model rather than choose a value, so they live apart from the families' spaces:

- ``prune``: structured pruning -- remove a share of the output units of every Linear/Conv that feeds one
  other Linear/Conv through activations/BatchNorm only, with the matching inputs of that layer.
- ``semisparse``: 2:4 semi-structured sparsity of Linear weights, run on sparse tensor cores (CUDA 8.x).

Nothing is imported here: ``semisparse`` imports torch, and the search space is read without it.
"""
