"""FLOP a workload's training does per sample: torch's ``FlopCounterMode`` over one training step's forward and
backward passes of the dense model, so a trial's samples/s is also GFLOP/s. Counted once per study, on the CPU, on
two of the dataset's samples: matmuls and convolutions, what the counter counts, scale with the batch. Sparsity
and pruning show as less time for the same useful work, never as fewer FLOP: the model is the user's own.

The search's process never calls the user's loss (it may count, log or fail: only trials train), so the backward
pass starts from the sum of the model's floating outputs: the same graph through the model as any loss of all its
outputs takes; a loss's own FLOP (an elementwise sum or a cross-entropy, as a rule) are not counted.
"""
from __future__ import annotations

import logging

from ._workload import Workload, output_tensors

log = logging.getLogger(__name__)

SAMPLES = 2  # enough to run batch norm in training mode; the count per sample is the same at any batch


def flop_per_sample(workload: Workload, samples: int = SAMPLES) -> float | None:
    """FLOP of one training step per sample (forward and backward; an optimizer's elementwise update is not
    counted), or None when the model cannot run here (its trials report why) or does nothing the counter counts.

    >>> import torch
    >>> from autotune import Workload
    >>> linear = Workload(model=lambda: torch.nn.Linear(8, 4, bias=False),
    ...     dataset=lambda: torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 4)),
    ...     loss=lambda out, batch: torch.nn.functional.mse_loss(out, batch[1]),
    ...     optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    >>> flop_per_sample(linear)  # a sample: forward 8x4 multiply-adds (2 FLOP each), its weight's gradient as many
    128.0
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        model = workload.model()
        dataset = workload.dataset()
        count = min(samples, len(dataset))
        batch = torch.utils.data.default_collate([dataset[i] for i in range(count)])
        model.train()
        with FlopCounterMode(display=False) as counter:
            outputs = [t for t in output_tensors(model(*workload.model_inputs(batch))) if t.requires_grad]
            if outputs:
                torch.stack([t.float().sum() for t in outputs]).sum().backward()
    except Exception as e:  # noqa: BLE001 - a workload that cannot run fails its trials, with their traceback
        log.debug("FLOP not counted: %s", e)
        return None
    total = counter.get_total_flops()
    return total / count if total > 0 and count > 0 else None

