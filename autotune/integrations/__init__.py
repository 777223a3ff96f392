"""Framework trainers, tuned and searched through one callback each (optional extras: each module imports its
framework on first use, never at import).

- ``autotune.integrations.transformers``: Hugging Face ``Trainer`` (``pip install 'autotune[transformers]'``).
- ``autotune.integrations.lightning``: Lightning's ``Trainer`` (``pip install 'autotune[lightning]'``).
"""
