"""``autotune probe``: print the hardware facts of this machine or of a recorded one."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "probe",
        help="read the hardware and print its facts",
        description="Read this machine's CPU topology (hwloc), ISA, memory, torch runtime and GPUs (NVML) "
        "and print them. With --root, read a recorded machine instead; with --record, record this one.",
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import probes

    if args.record:
        written = probes.record(args.record)
        print(f"recorded this machine in {written}; read it back with: "
              f"mkdir tree && tar xf {written} -C tree && autotune probe --root tree/{_stem(written.name)}")
        return 0
    facts = probes.probe(args.root, runtime=not args.no_runtime, gpus=not args.no_gpus)
    print(facts.to_json(indent=2) if args.json else probes.summary(facts))
    return 0


def _stem(name: str) -> str:
    return name.removesuffix(".tar.gz").removesuffix(".tgz")
