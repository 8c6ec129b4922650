"""Device mesh, multi-host start-up and sharding of parameters and batches.

The mesh always has the three axes ``("data", "fsdp", "tensor")`` (sizes may be 1), so partition
rules and batch specs are written once and run unchanged on one CPU, a GPU node or a TPU pod.
Batches are split along ``("data", "fsdp")`` together: FSDP shards parameters *and* data, the
``tensor`` axis shards only parameters (every tensor-parallel replica sees the same rows).
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# A rule maps a parameter path ("layers/0/attn/q/kernel") and shape to a PartitionSpec.
PartitionRules = Sequence[tuple[str, P]] | Callable[[str, tuple], P]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; ``-1`` (at most one axis) takes all devices left over by the others."""
    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        sizes = dataclasses.asdict(self)
        for name, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
                raise ValueError(f"mesh.{name} must be a positive int or -1, got {size!r}")
        if list(sizes.values()).count(-1) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got {sizes}")

    def resolve(self, num_devices: int) -> dict[str, int]:
        """Axis sizes with ``-1`` filled in; raises if they do not multiply to ``num_devices``."""
        sizes = dataclasses.asdict(self)
        known = int(np.prod([s for s in sizes.values() if s != -1]))
        for name, size in sizes.items():
            if size == -1:
                if num_devices % known:
                    raise ValueError(
                        f"mesh.{name}=-1 cannot fill {num_devices} devices: the other axes "
                        f"({_fmt(sizes)}) multiply to {known}, which does not divide {num_devices}")
                sizes[name] = num_devices // known
        total = int(np.prod(list(sizes.values())))
        if total != num_devices:
            bad = max((n for n in sizes if sizes[n] > 1), key=lambda n: sizes[n], default="data")
            raise ValueError(f"mesh {_fmt(sizes)} needs {total} devices but {num_devices} are "
                             f"available; change mesh.{bad} (or set one axis to -1)")
        return sizes


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How to join a multi-controller run (``jax.distributed``).

    With ``coordinator_address`` set, the three explicit fields are used (any machine, e.g. CPU
    processes on localhost). With ``auto=True``, or when ``JAX_COORDINATOR_ADDRESS`` is set in the
    environment, JAX detects the rest itself (TPU pods, SLURM, Open MPI, Kubernetes). Otherwise the
    run is single-process.
    """
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    auto: bool = False
    initialization_timeout: int = 300

    def __post_init__(self):
        explicit = (self.num_processes, self.process_id)
        if self.coordinator_address is not None and None in explicit:
            raise ValueError("distributed.coordinator_address needs distributed.num_processes and "
                             "distributed.process_id")
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(f"distributed.num_processes must be >= 1, got {self.num_processes}")
        if self.process_id is not None and self.num_processes is not None and not (
                0 <= self.process_id < self.num_processes):
            raise ValueError(f"distributed.process_id={self.process_id} is outside "
                             f"[0, distributed.num_processes={self.num_processes})")
        if self.initialization_timeout < 1:
            raise ValueError("distributed.initialization_timeout must be >= 1 second")


def initialize_distributed(config: DistributedConfig) -> bool:
    """Start ``jax.distributed`` when the config (or the environment) asks for it.

    Must run before anything touches the JAX backend. Returns True when a multi-process runtime was
    started. Collectives on CPU use gloo, JAX's default for the CPU backend.
    """
    env_address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if config.coordinator_address is None and not config.auto and env_address is None:
        return False
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        local_device_ids=config.local_device_ids,
        initialization_timeout=config.initialization_timeout)
    return True


def make_mesh(config: MeshConfig, *, devices: Sequence | None = None) -> Mesh:
    """A ``("data", "fsdp", "tensor")`` mesh over ``devices`` (default: all global devices).

    Axis types are ``Auto`` (classic GSPMD propagation; ``jax.make_mesh`` would default to
    Explicit in jax 0.10). The device order comes from ``jax.make_mesh`` so that on TPU/GPU the
    innermost axis (``tensor``) maps to the fastest interconnect.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = config.resolve(len(devices))
    shape = tuple(sizes[a] for a in AXES)
    return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
                         devices=devices)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def path_str(path) -> str:
    """``("layers", 0, "attn", "kernel")``-style key path -> ``"layers/0/attn/kernel"``."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    # nnx Variables flatten to a trailing ".value" that is not part of the parameter's name.
    if parts and parts[-1] == "value":
        parts = parts[:-1]
    return "/".join(parts)


def _fit_spec(spec: P, shape: tuple, mesh: Mesh) -> P:
    """Drop mesh axes from dims they do not divide (replicate that dim) and pad to the rank.

    A rule written for a big model (e.g. heads over ``tensor``) must not break a tiny test
    config whose dimension is not a multiple of the axis size; replicating is always correct.
    """
    entries = list(spec) + [None] * (len(shape) - len(spec))
    if len(entries) > len(shape):
        raise ValueError(f"partition spec {spec} has more entries than the array rank {len(shape)}")
    fitted = []
    for dim, entry in zip(shape, entries):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
        fitted.append(entry if axes and dim % size == 0 else None)
    return P(*fitted)


def spec_for(path: str, shape: tuple, rules: PartitionRules | None) -> P:
    """The first rule whose regex matches ``path`` (``re.search``), else replicated."""
    if rules is None:
        return P()
    if callable(rules):
        return rules(path, shape)
    for pattern, spec in rules:
        if re.search(pattern, path):
            return spec
    return P()


def model_rules(mesh: Mesh, rules=None) -> Callable[[str, tuple], P]:
    """The :mod:`hindsight.models` partition rules as a ``(path, shape) -> PartitionSpec`` callable.

    Those rules are written for unstacked parameters; ``hindsight.models.spec_for`` adds the
    stacked layer axis of the scan layout and fits them to ``mesh``. Pass the result as ``rules``
    to :func:`hindsight.train.state.create_train_state`.
    """
    from hindsight.models.partition import DEFAULT_RULES, spec_for  # lazy: train needs models only here
    table = DEFAULT_RULES if rules is None else rules
    return lambda path, shape: spec_for(path, shape, mesh=mesh, rules=table)


def param_shardings(params, mesh: Mesh, rules: PartitionRules | None):
    """A pytree of ``NamedSharding`` matching ``params`` (arrays or ShapeDtypeStructs)."""
    def one(path, leaf):
        shape = tuple(np.shape(leaf))
        return NamedSharding(mesh, _fit_spec(spec_for(path_str(path), shape, rules), shape, mesh))
    return jax.tree_util.tree_map_with_path(one, params)


def _fmt(sizes: dict) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ")"
