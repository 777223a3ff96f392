"""Structured pruning: remove whole output units (neurons, conv channels) so layers really get smaller.

A zeroing mask makes nothing faster on dense kernels; removing units does: a Linear(64, 128) that loses
half its outputs becomes a Linear(64, 64), and the layer it feeds becomes a Linear(64, n).

Which layers are pruned (``find_pairs``): the model is traced with ``torch.fx``; a ``Linear`` or
``Conv1d/2d/3d`` (groups 1) is a *producer* when its output reaches exactly one *consumer* of the same
kind only through elementwise ops that keep the units where they are (activations, dropout) and
``BatchNorm`` layers (sliced with it). Conv producers may also pass per-channel pooling, and a
``Flatten(1)`` after pooling to 1x1 into a ``Linear`` (ResNet's head), where channel c is feature c.
Anything else stops the search, so nothing is pruned that feeds a residual add, a concatenation,
a reshape, a LayerNorm, a layer called twice, a tied weight or the model's output.
A module fx cannot trace is searched child by child; ``torch.nn.TransformerEncoderLayer`` and
``TransformerDecoderLayer`` (untraceable) are known: their feed-forward block
``linear2(dropout(activation(linear1(x))))`` is a pair.

Which units (``prune``): the ``ratio`` of each producer's units with the smallest L1 norm of weights
(Li et al. 2017, "Pruning Filters for Efficient ConvNets"); kept counts are rounded to multiples of 8
where the layer had a multiple of 8, for vectorised kernels.

Example::

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    >>> prune(model, 0.5).channels_removed, model[0].out_features, model[2].in_features
    (64, 64, 64)
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.fx
    from torch import nn

# Types: a model is an ``nn.Module`` where it is passed on; a layer whose own attributes are read or set
# (``out_features``, ``groups``, ``num_features``, ``weight``) is ``Any``, as torch's stubs type every
# attribute of an ``nn.Module`` as ``Tensor | Module``. Graph nodes are ``torch.fx.Node``.
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pair:
    """``producer`` loses output units; ``consumer`` the matching input units; ``norms`` are sliced too."""

    producer: str
    consumer: str
    norms: tuple[str, ...] = ()


@dataclass(frozen=True)
class PruneReport:
    ratio: float
    layers: int  # producers pruned
    channels_removed: int
    channels_total: int  # output units of the prunable producers
    params_before: int
    params_after: int

    def to_dict(self) -> dict[str, Any]:
        """The form the trial's ``in_effect`` reports."""
        return {
            "sparsity_pattern": "structured",
            "ratio": self.ratio,
            "layers": self.layers,
            "channels_removed": self.channels_removed,
            "channels_total": self.channels_total,
            "removed_channel_fraction": self.channels_removed / self.channels_total if self.channels_total else 0.0,
            "params_before": self.params_before,
            "params_after": self.params_after,
            "removed_param_fraction": 1 - self.params_after / self.params_before if self.params_before else 0.0,
        }


def _kinds() -> tuple[Any, Any, Any, Any, Any, set[Any], set[str]]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    passthrough = (
        nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid,
        nn.Tanh, nn.ELU, nn.SELU, nn.CELU, nn.Softplus, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
        nn.AlphaDropout, nn.Identity,
    )
    pools = (
        nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
        nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
        nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
    )
    convs = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
    norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    functions = {
        F.relu, F.relu6, F.leaky_relu, F.gelu, F.silu, F.mish, F.hardswish, F.elu, F.selu, F.dropout,
        F.dropout1d, F.dropout2d, F.dropout3d, torch.relu, torch.sigmoid, torch.tanh, F.sigmoid, F.tanh,
    }
    methods = {"relu", "relu_", "sigmoid", "tanh", "contiguous"}
    return passthrough, pools, convs, norms, nn.Linear, functions, methods


def _has_node(value: torch.fx.node.Argument) -> bool:
    import torch.fx

    found = False

    def visit(arg: torch.fx.Node) -> torch.fx.Node:
        nonlocal found
        found = True
        return arg

    torch.fx.node.map_arg(value, visit)
    return found


def _only_input(node: torch.fx.Node, prev: torch.fx.Node) -> bool:
    """``node`` takes ``prev`` as its one tensor input (other arguments are constants)."""
    return bool(node.args) and node.args[0] is prev and not _has_node((node.args[1:], node.kwargs))


def _module_name(node: torch.fx.Node) -> str:
    """A ``call_module`` node's target: the module's qualified name (fx types any target as ``str | Callable``)."""
    return str(node.target)


def _units(module: Any) -> int:
    return int(getattr(module, "out_features", 0) or getattr(module, "out_channels", 0))


def _follow(start: torch.fx.Node, producer: Any, modules: dict[str, Any], calls: Counter[str]) -> Pair | None:
    """Walk from a producer's node to the one layer its units flow into, or None when unsafe."""
    passthrough, pools, convs, norms, linear, functions, methods = _kinds()
    kind = "linear" if isinstance(producer, linear) else "conv"
    units, pooled_to_one = _units(producer), False
    found: list[str] = []
    prev = start
    while True:
        if len(prev.users) != 1:
            return None
        node = next(iter(prev.users))
        if not _only_input(node, prev):
            return None
        if node.op == "call_module":
            name = _module_name(node)
            module = modules[name]
            if calls[name] != 1:
                return None
            if type(module) is linear and kind == "linear" and module.in_features == units:
                return Pair(_module_name(start), name, tuple(found))
            if type(module) is type(producer) and kind == "conv" and module.in_channels == units and module.groups == 1:
                return Pair(_module_name(start), name, tuple(found))
            if isinstance(module, norms) and module.num_features == units:
                found.append(name)
            elif isinstance(module, pools) and kind == "conv":
                size = getattr(module, "output_size", None)
                pooled_to_one = size is not None and all(s == 1 for s in (size if isinstance(size, tuple) else (size,)))
            elif type(module).__name__ == "Flatten" and kind == "conv" and pooled_to_one:
                if (module.start_dim, module.end_dim) != (1, -1):
                    return None
                kind = "linear"  # 1x1 spatial: channel c becomes feature c
            elif not isinstance(module, passthrough):
                return None
        elif not (node.op == "call_function" and node.target in functions) and not (
            node.op == "call_method" and node.target in methods
        ):
            return None
        prev = node


def _known_pair(module: nn.Module, prefix: str) -> list[Pair]:
    """torch's transformer layers cannot be traced; their feed-forward block is a known pair."""
    from torch import nn

    if not isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        return []
    passthrough, functions = _kinds()[0], _kinds()[5]
    elementwise = module.activation in functions or isinstance(module.activation, passthrough)
    linears = type(module.linear1) is nn.Linear and type(module.linear2) is nn.Linear
    return [Pair(prefix + "linear1", prefix + "linear2")] if elementwise and linears else []


def _trace_pairs(module: nn.Module, prefix: str) -> list[Pair]:
    import torch.fx

    try:
        graph = torch.fx.Tracer().trace(module)
    except Exception as e:  # noqa: BLE001 - fx raises many kinds; the children may still trace
        log.debug("fx cannot trace %s (%s): searching its children", prefix or "the model", e)
        return [p for name, child in module.named_children() for p in _trace_pairs(child, f"{prefix}{name}.")]
    modules = dict(module.named_modules())
    calls = Counter(n.target for n in graph.nodes if n.op == "call_module")
    pairs = []
    for node in graph.nodes:
        if node.op == "call_module" and calls[node.target] == 1 and _prunable_layer(modules[node.target]):
            pair = _follow(node, modules[node.target], modules, calls)
            if pair is not None:
                norms = tuple(prefix + n for n in pair.norms)
                pairs.append(Pair(prefix + pair.producer, prefix + pair.consumer, norms))
    return pairs


def _prunable_layer(module: Any) -> bool:
    from torch import nn

    if type(module) is nn.Linear:
        return module.out_features > 1
    return type(module) in (nn.Conv1d, nn.Conv2d, nn.Conv3d) and module.groups == 1 and module.out_channels > 1


def find_pairs(model: nn.Module) -> list[Pair]:
    """The (producer, consumer) layer pairs of ``model`` that can lose units safely."""
    pairs = _trace_pairs(model, "")
    pairs += [p for name, m in model.named_modules() for p in _known_pair(m, f"{name}." if name else "")]
    # A weight tied to another module would be sliced under that module's feet.
    counts = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    shared = {name for name, p in model.named_parameters(remove_duplicate=False) if counts[id(p)] > 1}
    return [
        p for p in pairs
        if not any(name.startswith((p.producer + ".", p.consumer + ".")) for name in shared)
    ]


def _kept(units: int, ratio: float) -> int:
    keep = max(1, round(units * (1 - ratio)))
    if units % 8 == 0 and keep > 8:
        keep = min(units, 8 * math.ceil(keep / 8))
    return keep


def _slice(module: nn.Module, name: str, index: torch.Tensor, dim: int) -> None:
    import torch

    tensor = getattr(module, name, None)
    if tensor is None:
        return
    sliced = tensor.detach().index_select(dim, index).clone()
    if isinstance(tensor, torch.nn.Parameter):
        setattr(module, name, torch.nn.Parameter(sliced, requires_grad=tensor.requires_grad))
    else:
        setattr(module, name, sliced)


def _prune_pair(model: nn.Module, pair: Pair, ratio: float) -> tuple[int, int]:
    import torch

    producer: Any = model.get_submodule(pair.producer)
    consumer: Any = model.get_submodule(pair.consumer)
    units = _units(producer)
    keep_count = _kept(units, ratio)
    if keep_count >= units:
        return 0, units
    scores = producer.weight.detach().abs().flatten(1).sum(1)
    keep = torch.topk(scores, keep_count).indices.sort().values
    _slice(producer, "weight", keep, 0)
    _slice(producer, "bias", keep, 0)
    setattr(producer, "out_features" if hasattr(producer, "out_features") else "out_channels", keep_count)
    for norm_name in pair.norms:
        norm: Any = model.get_submodule(norm_name)
        for name in ("weight", "bias", "running_mean", "running_var"):
            _slice(norm, name, keep, 0)
        norm.num_features = keep_count
    _slice(consumer, "weight", keep, 1)
    setattr(consumer, "in_features" if hasattr(consumer, "in_features") else "in_channels", keep_count)
    return units - keep_count, units


def prune(model: nn.Module, ratio: float) -> PruneReport:
    """Remove ``ratio`` of the units of every prunable layer of ``model``, in place; before the optimizer."""
    if not 0 <= ratio < 1:
        raise ValueError(f"sparsity ratio {ratio} is outside [0, 1)")
    params_before = sum(p.numel() for p in model.parameters())
    pairs = find_pairs(model) if ratio > 0 else []
    removed = total = layers = 0
    for pair in pairs:
        gone, units = _prune_pair(model, pair, ratio)
        removed, total, layers = removed + gone, total + units, layers + (gone > 0)
    params_after = sum(p.numel() for p in model.parameters())
    return PruneReport(ratio, layers, removed, total, params_before, params_after)
