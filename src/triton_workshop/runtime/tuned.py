"""Tuned configurations kept as data: what the autotuner would pick, named before it has to time.

Triton's autotuner times every candidate config of a kernel the first time it meets a new tuning
key (the kernel's ``key`` arguments and the dtypes of its tensors), and a cold first step of a model
spends most of its time compiling and timing those candidates. A table that names the winner of
each key it has seen makes that work unnecessary: :func:`preload` puts the table's entries into
the autotuner's own cache, keyed exactly as the autotuner keys them, so a key the table knows is
launched at once, and a key it does not know is tuned as before. Under ``torch.compile``,
:func:`single_config` gives the traced graph the one config the table (or an eager run of this
process) chose, so Inductor does not time every candidate of the kernel again.

Tables are JSON files, one per GPU architecture (``sm90``: H100, H200), written by ``workshop
tune`` (:mod:`triton_workshop.tune`) on the GPU it finds. The package ships its own
(``runtime/tuned/<arch>.json``); a file written by ``workshop tune`` (``$TRITON_WORKSHOP_TUNED_DIR``,
default ``~/.cache/triton_workshop/tuned``) is read first, so its entries win. An entry that
no longer matches a kernel's configs (the candidate list changed) is skipped; an entry for
another Triton version's key layout simply never matches. ``TRITON_WORKSHOP_TUNED=0`` turns the
tables off (``workshop tune`` itself runs that way).

Format::

    {"format": 1, "arch": "sm90", "gpu": "NVIDIA H100 80GB HBM3", "triton": "3.6.0",
     "kernels": {"triton_workshop.ops.matmul.kernels.matmul_kernel":
                   [[[4096, 4096, 4096, "tf32", "torch.bfloat16", ...],
                     {"kwargs": {"BLOCK_M": 128, ...}, "num_warps": 8, "num_stages": 3}], ...]}}
"""

from __future__ import annotations

import functools
import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Iterable

import torch


FORMAT = 1
#: The package's own tables.
PACKAGE_DIR = Path(__file__).resolve().parent / "tuned"

#: Every autotuned kernel of the package (weakly), for ``workshop tune`` to read back.
_TUNERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_preloaded: "weakref.WeakSet[Any]" = weakref.WeakSet()
_lock = threading.Lock()


def enabled() -> bool:
    """Whether tables are read (``TRITON_WORKSHOP_TUNED=0``: no)."""
    return os.environ.get("TRITON_WORKSHOP_TUNED", "1") != "0"


def user_dir() -> Path:
    """Where ``workshop tune`` writes its tables (read before the package's own)."""
    return Path(os.environ.get("TRITON_WORKSHOP_TUNED_DIR")
                or Path.home() / ".cache" / "triton_workshop" / "tuned")


def device_arch(device: "torch.device | int | None" = None) -> str:
    """``"sm90"`` for an H100: the key a table is stored under."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def kernel_name(tuner) -> str:
    """The module-qualified name of the Python function an autotuner tunes."""
    fn = getattr(tuner, "base_fn", None) or tuner.fn
    while hasattr(fn, "fn") and not hasattr(fn, "__qualname__"):
        fn = fn.fn
    return f"{fn.__module__}.{fn.__qualname__}"


def register(tuner) -> None:
    """Remember ``tuner`` (called by :func:`runtime.autotune` for each kernel it decorates)."""
    _TUNERS.add(tuner)


def tuners() -> list:
    return sorted(_TUNERS, key=kernel_name)


# --------------------------------------------------------------------------------------------
# Reading.
# --------------------------------------------------------------------------------------------
def table_files(arch: str) -> list[Path]:
    """The tables for ``arch``, the user's first (their entries win)."""
    return [p for p in (user_dir() / f"{arch}.json", PACKAGE_DIR / f"{arch}.json") if p.is_file()]


@functools.lru_cache(maxsize=None)
def _entries(arch: str) -> dict[str, list]:
    """``{kernel name: [(key, config dict), ...]}`` for ``arch``, the user's table first."""
    merged: dict[str, list] = {}
    for path in table_files(arch):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a damaged table is no table: the autotuner tunes as before
        if data.get("format") != FORMAT:
            continue
        for name, rows in data.get("kernels", {}).items():
            merged.setdefault(name, []).extend(rows)
    return merged


def _key(row_key: list) -> tuple:
    return tuple(row_key)


def _same_config(config, spec: dict) -> bool:
    return (config.kwargs == spec.get("kwargs") and config.num_warps == spec.get("num_warps")
            and config.num_stages == spec.get("num_stages"))


def preload(tuner, arch: str | None = None) -> int:
    """Put the table's entries for ``tuner``'s kernel into its cache (once per tuner); returns
    how many. Each entry's config must be one of the tuner's own candidates (the same object, so
    everything keyed by config stays consistent); others are skipped."""
    if tuner in _preloaded or not enabled():
        return 0
    with _lock:
        if tuner in _preloaded:
            return 0
        _preloaded.add(tuner)
        if arch is None:
            if not torch.cuda.is_available():
                return 0
            arch = device_arch()
        rows = _entries(arch).get(kernel_name(tuner), ())
        cache = tuner.cache
        loaded = 0
        for row_key, spec in rows:
            key = _key(row_key)
            if key in cache:
                continue  # the user's table (read first) or this process's own tuning won
            config = next((c for c in tuner.configs if _same_config(c, spec)), None)
            if config is not None:
                cache[key] = config
                loaded += 1
        return loaded


_table_pick = threading.local()


def table_tuner(tuner):
    """``tuner`` made to take the table's config for a key it has not tuned yet, instead of
    timing its candidates (the same object: torch.compile still sees it). Costs nothing once a
    key is tuned: Triton asks for candidates only for a key missing from its cache."""
    base = type(tuner)
    if not hasattr(base, "prune_configs"):
        return tuner
    tuner.__class__ = _table_class(base)
    return tuner


@functools.lru_cache(maxsize=None)
def _table_class(base):
    class TableAutotuner(base):
        def prune_configs(self, kwargs, *rest, **more):
            config = known_config(self, tuple((self.nargs or {}).values()), kwargs)
            # Releases that still time a lone candidate (Triton 3.6) skip the timing; a flag left
            # by a release that does not time it is cleared by the next key's pruning, here.
            _table_pick.on = config is not None
            if config is not None:
                return [config]
            return super().prune_configs(kwargs, *rest, **more)

    TableAutotuner.__qualname__ = f"Table{base.__name__}"
    return TableAutotuner


def take_table_pick() -> bool:
    """Whether the candidate about to be timed is the table's pick (then timing it is moot);
    read once by the autotuner's timing function."""
    if getattr(_table_pick, "on", False):
        _table_pick.on = False
        return True
    return False


def tuning_key(tuner, args: tuple, kwargs: dict) -> tuple | None:
    """The key Triton's autotuner files a call under (its ``key`` arguments, then the dtype of
    each tensor argument, in the order of the kernel's parameters), or None where an argument is
    symbolic (dynamic shapes under torch.compile) and no table can name it."""
    names = tuner.arg_names
    call = dict(zip(names, args))
    call.update((k, v) for k, v in kwargs.items() if k in names)
    key = []
    for name in tuner.keys:
        if name in call:
            value = call[name]
            if isinstance(value, torch.SymInt):
                return None
            key.append(value)
    key.extend(str(v.dtype) for v in call.values() if hasattr(v, "dtype"))
    return tuple(key)


def known_config(tuner, args: tuple, kwargs: dict):
    """The config the table (or this process's own tuning) names for this call, or None."""
    if len(getattr(tuner, "configs", ())) < 2:
        return None
    preload(tuner)
    key = tuning_key(tuner, args, kwargs)
    return None if key is None else tuner.cache.get(key)


@functools.lru_cache(maxsize=None)
def _single(tuner, config):
    import triton

    one = triton.autotune(configs=[config], key=list(tuner.keys))(tuner.fn)
    return one


def single_config(tuner, args: tuple, kwargs: dict):
    """``tuner`` itself, or where its config for this call is known, an autotuner of that one
    config over the same kernel: what a traced graph should launch, so that Inductor, which times
    every candidate of an autotuned kernel it is given, has nothing to time."""
    config = known_config(tuner, args, kwargs)
    return tuner if config is None else _single(tuner, config)


# --------------------------------------------------------------------------------------------
# Writing (``workshop tune``).
# --------------------------------------------------------------------------------------------
def _jsonable(value) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


def snapshot(of: Iterable | None = None) -> dict[str, list]:
    """``{kernel name: [[key, config], ...]}`` of what the autotuners have chosen so far."""
    kernels: dict[str, list] = {}
    for tuner in (tuners() if of is None else of):
        rows = []
        for key, config in getattr(tuner, "cache", {}).items():
            if not all(_jsonable(k) for k in key) or not all(
                    _jsonable(v) for v in config.kwargs.values()):
                continue
            rows.append([list(key), {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
                                     "num_stages": config.num_stages}])
        if rows:
            kernels.setdefault(kernel_name(tuner), []).extend(sorted(rows, key=repr))
    return kernels


def write_table(path: Path, kernels: dict[str, list], *, arch: str, gpu: str,
                merge: bool = True) -> Path:
    """Write ``kernels`` as a table at ``path``; with ``merge``, entries already in that file for
    keys not tuned now are kept."""
    import triton

    if merge and path.is_file():
        try:
            old = json.loads(path.read_text()).get("kernels", {})
        except ValueError:
            old = {}
        for name, rows in old.items():
            new_keys = {repr(r[0]) for r in kernels.get(name, [])}
            kept = [r for r in rows if repr(r[0]) not in new_keys]
            if kept:
                kernels.setdefault(name, []).extend(kept)
    data = {"format": FORMAT, "arch": arch, "gpu": gpu, "triton": triton.__version__,
            "torch": torch.__version__, "kernels": dict(sorted(kernels.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    _entries.cache_clear()
    return path
