"""Slots: the GPUs and host cores of one host shared out between trials that run at once.

A trial (one configuration of a search: its own server, port and load generator) needs as
many GPUs as its flags ask for (tensor x pipeline x data parallel, engine.flags.devices_needed).
The GPUs given to a search are cut into slots of the largest size any configuration needs, so
trials never share a GPU; ``--parallel`` caps how many run at once. The host's cores are cut the
same way, so a trial's server (pinned with ``taskset``) does not take the cores its neighbour's
client reads streams on.

On a box without GPUs there is one slot with no devices: the search runs as it always did.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.flags import devices_needed
from engine.server.supervisor import Supervisor
from engine.telemetry.nvml import visible_gpus
from engine.tune.search import ServerMeasurer

if TYPE_CHECKING:
    from engine.flags import FlagSet
    from engine.tune.search import Measurer
    from loadgen.spec import SLO, ArrivalSpec, WorkloadSpec


class SlotError(ValueError):
    """GPUs or a parallelism that cannot make a slot, naming what was wrong."""


@dataclass(frozen=True)
class Slot:
    """Where one trial runs: its GPUs (CUDA_VISIBLE_DEVICES for its server) and host cores."""

    index: int
    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """The server's environment additions: only its own GPUs are visible to it."""
        # NVML's indices (what --gpus and visible_gpus speak) follow the PCI bus; CUDA's own
        # order is fastest-first unless told otherwise, so it is told.
        return ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus))}
                if self.gpus else {})

    def launcher(self, taskset: str | None) -> list[str]:
        """The argv prefix that pins the server to this slot's cores (none without taskset)."""
        return [taskset, "-c", ",".join(map(str, self.cpus))] if taskset and self.cpus else []

    def client_cpus(self, *, side_by_side: bool) -> tuple[int, ...] | None:
        """The cores the trial's load generator is pinned to: the slot's beside other trials,
        none (every core) for a lone trial, as :func:`trial_supervisor` does for its server."""
        return (self.cpus or None) if side_by_side else None

    def label(self) -> str:
        gpus = f"GPU {','.join(map(str, self.gpus))}" if self.gpus else "no GPU"
        return f"slot {self.index} ({gpus})"


def parse_gpus(text: str, *, label: str = "--gpus") -> tuple[int, ...]:
    """``"0,1,2,3"`` or ``"0-3"`` or ``"0,2-3"`` -> (0, 1, 2, 3); SlotError when it is not one,
    its message starting with ``label`` (the option's or the form field's name)."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SlotError(f"{label} {text!r}: {part!r} is not a GPU index or a range such as 0-3")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise SlotError(f"{label} {text!r}: the range {part!r} runs backwards")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise SlotError(f"{label} {text!r}: a GPU is named twice")
    return tuple(out)


def check_visible(asked: Sequence[int], visible: Sequence[int], text: str, *, label: str = "--gpus") -> None:
    """SlotError unless every GPU of ``--gpus TEXT`` is one this process can see."""
    if not visible:
        raise SlotError(f"{label} {text}: no NVIDIA GPU is visible on this machine")
    missing = [g for g in asked if g not in visible]
    if missing:
        seen = ",".join(str(g) for g in visible)
        raise SlotError(f"{label} {text}: GPU {', '.join(str(g) for g in missing)} is not visible here "
                        f"(visible: {seen}; CUDA_VISIBLE_DEVICES applies)")


def search_slots(gpus_text: str | None, needs: Iterable[int], *, parallel: int | None = None,
                 visible: Sequence[int] | None = None, label: str = "--gpus") -> list[Slot]:
    """A search's slots: ``--gpus`` (default every visible GPU, engine.telemetry.nvml.visible_gpus) cut into
    blocks of the most GPUs a configuration needs (``needs``: each one's), at most ``parallel``.
    SlotError for a GPU list that does not read or names a GPU this process cannot see (its
    message names ``label``: the CLI's option, or the Tune form's field)."""
    if visible is None:
        visible = visible_gpus()
    seen = tuple(visible)
    gpus = parse_gpus(gpus_text, label=label) if gpus_text else seen
    if gpus_text:
        check_visible(gpus, seen, gpus_text, label=label)
    return plan_slots(gpus, slot_size(needs, len(gpus)), parallel=parallel)


def slot_measurers(slots: Sequence[Slot], workload: WorkloadSpec, slo: SLO, *, mode: str = "rate",
                   arrivals: ArrivalSpec | None = None, tokenizer: str | None = None,
                   factory: Callable[..., Measurer] | None = None) -> list[Measurer]:
    """One measurer per slot, each with a server of its own (``vtui tune`` on one host, and the
    Tune screen with more than one slot): the first is the search's ``Tuner`` measurer, the rest
    its ``slots``. Each trial's servers start on its slot's GPUs (:func:`trial_supervisor`);
    beside other trials, its server and its load generator are pinned to the slot's cores
    (``client_cpus``); a lone one keeps every core (pinning one measured worse, docs/SCALE.md).

    ``factory``: called like ``engine.tune.search.ServerMeasurer(workload, slo, mode=, arrivals=,
    tokenizer=, supervisor_factory=, client_cpus=)`` (the default; tests pass a stand-in)."""
    if factory is None:
        factory = ServerMeasurer
    side_by_side = len(slots) > 1
    return [factory(workload, slo, mode=mode, arrivals=arrivals, tokenizer=tokenizer,
                    supervisor_factory=trial_supervisor(slot, side_by_side=side_by_side),
                    client_cpus=slot.client_cpus(side_by_side=side_by_side))
            for slot in slots]


def too_wide(base: FlagSet, configs: Iterable[Mapping[str, object]], gpus: int) -> list[tuple[Mapping[str, object], int]]:
    """The configurations that need more than ``gpus`` GPUs, each with what it needs (``vtui
    tune`` lets the search mark them invalid; the Tune form refuses them before it starts)."""
    out: list[tuple[Mapping[str, object], int]] = []
    for values in configs:
        need = devices_needed({**base.values, **values})
        if need > gpus:
            out.append((values, need))
    return out


def trial_needs(base: FlagSet, configs: Iterable[Mapping[str, object]]) -> list[int]:
    """GPUs each configuration of a search needs (engine.flags.devices_needed): ``base``'s
    flags with the configuration's values over them."""
    return [devices_needed({**base.values, **values}) for values in configs]


def slot_supervisor(slot: Slot, *, pin: bool = True, taskset: str | None = None) -> Callable[[FlagSet], Supervisor]:
    """A Supervisor factory for one slot: its GPUs only (``slot.env()``), pinned to its cores
    when ``pin`` (``taskset``, default the box's own, found once here; none on a box without
    it), a port of its own (each picks a free one)."""
    found = (taskset if taskset is not None else shutil.which("taskset")) if pin else None

    def make(flags: FlagSet) -> Supervisor:
        return Supervisor(flags, env=slot.env(), launcher=slot.launcher(found))

    return make


def trial_supervisor(slot: Slot, *, side_by_side: bool) -> Callable[[FlagSet], Supervisor] | None:
    """How a search's trial in ``slot`` starts its servers: on the slot's GPUs whenever it has
    any (``--gpus 3`` on an 8-GPU box means GPU 3, even for one slot), pinned to the slot's
    cores only beside other trials (a lone trial's server and client keep every core: pinning
    one measured worse, docs/SCALE.md); None (the default Supervisor) on a CPU box alone."""
    if not side_by_side and not slot.gpus:
        return None
    return slot_supervisor(slot, pin=side_by_side)


def slot_size(needs: Iterable[int], gpus: int) -> int:
    """GPUs per slot: the most any configuration needs among those that fit in ``gpus`` (one
    needing more is the search's to mark invalid, as on one GPU, not a reason to refuse the
    whole search); 1 when none fits."""
    return max([n for n in needs if n <= gpus] or [1])


def plan_slots(gpus: Sequence[int], size: int, *, parallel: int | None = None,
               cpus: Sequence[int] | None = None) -> list[Slot]:
    """Slots of ``size`` GPUs each out of ``gpus`` (no GPU shared), at most ``parallel`` of
    them, and the host's ``cpus`` (default: this process's affinity) shared out in equal
    contiguous blocks. No GPUs: one slot without devices (a CPU box)."""
    if parallel is not None and parallel < 1:
        raise SlotError(f"--parallel {parallel}: must be at least 1")
    if size < 1:
        raise SlotError(f"a trial needs at least one GPU, not {size}")
    host = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if not gpus:
        return [Slot(0, (), tuple(host))]
    n = len(gpus) // size
    if n == 0:
        raise SlotError(f"a configuration of the search needs {size} GPUs, and {len(gpus)} were given "
                        f"({','.join(map(str, gpus))})")
    if parallel is not None:
        n = min(n, parallel)
    share = max(1, len(host) // n)
    slots = []
    for i in range(n):
        mine = tuple(host[i * share:(i + 1) * share]) if len(host) >= n else tuple(host)  # too few: shared
        slots.append(Slot(i, tuple(gpus[i * size:(i + 1) * size]), mine))
    return slots
