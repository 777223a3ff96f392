"""``autotune probe``: print the hardware facts of this machine or of a recorded one."""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "probe",
        help="read the hardware and print its facts",
        description="Read this machine's CPU topology (hwloc), ISA, memory, torch runtime and GPUs (NVML) "
        "and print them, with the machine's measured limits: the matmul peak at float32 and bfloat16 and the "
        "memory bandwidth on the CPUs this process may use, beside the theoretical float32 peak, and where torch "
        "sees a GPU the first one's matmul peaks (float32, TF32, bfloat16, float16 as it computes them) and memory "
        "bandwidth (measured once, 2-3 s on a CPU, and cached: --measure measures again). With --root, read a "
        "recorded machine instead; with --record, record this one.",
    )
    p.add_argument("--json", action="store_true", help="print the facts as a versioned JSON document")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--root", metavar="DIR",
                   help="read a recorded tree (a directory holding sys/ and proc/, e.g. an unpacked "
                   "--record or hwloc-gather-topology tarball); runtime and GPUs are then not probed")
    source.add_argument("--record", metavar="FILE.tar.gz",
                   help="record this machine's topology files into FILE.tar.gz, to probe later with --root")
    p.add_argument("--no-runtime", action="store_true", help="do not import torch nor look for runtime libraries")
    p.add_argument("--no-gpus", action="store_true", help="do not query NVML")
    p.add_argument("--measure", action="store_true", help="measure the machine's limits again (else cached)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import probes

    if args.record:
        written = probes.record(args.record)
        print(f"recorded this machine in {written}; read it back with: "
              f"mkdir tree && tar xf {written} -C tree && autotune probe --root tree/{_stem(written.name)}")
        return 0
    facts = probes.probe(args.root, runtime=not args.no_runtime, gpus=not args.no_gpus)
    # a recorded tree is another machine, and without torch nothing can be timed
    limits = None if args.root or args.no_runtime else probes.limits(facts, refresh=args.measure)
    gpu = probes.limits(facts, "cuda", refresh=args.measure) if limits is not None and _cuda(facts) else None
    if args.json:
        measured = {"limits": limits.to_dict()} if limits else {}
        print(json.dumps({**facts.to_dict(), **measured, **({"gpu_limits": gpu.to_dict()} if gpu else {})}, indent=2))
    else:
        said = limits.describe() if limits else "not measured (a recorded tree or --no-runtime)"
        rows = (("Limits", said), *((("GPU limits", f"GPU 0: {gpu.describe()}"),) if gpu else ()))
        print(probes.summary(facts, rows))
    return 0


def _cuda(facts: object) -> bool:
    """Whether the probed GPUs can be timed here: torch sees CUDA."""
    import torch

    return bool(getattr(facts, "gpus", ())) and torch.cuda.is_available()


def _stem(name: str) -> str:
    return name.removesuffix(".tar.gz").removesuffix(".tgz")
