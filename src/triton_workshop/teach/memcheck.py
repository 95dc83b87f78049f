"""Bounds-checked memory for kernels run in Triton's interpreter, and GPU numerics on the CPU.

In interpreter mode every ``tl.load``/``tl.store`` ends in one of four methods of Triton's
interpreter builder (``create_load``, ``create_masked_load``, ``create_store``,
``create_masked_store``). While :func:`memory_checked` is active in a thread, those methods are
wrapped: each lane the mask lets through is checked against the byte ranges of the tensors the
kernel was launched with. A lane outside every tensor is *stopped*: a store there is dropped (never
reaches memory, so it cannot corrupt the heap) and a load there reads a poison value (NaN). The
report says which kernel line (file:line), which program(s), which offsets, which tensor it ran
past and what the mask let through.

The same wrappers keep a *write map* of every tensor: which program stored each element, and how
often. The checker uses it to tell "never written" from "written wrong" and to see stores that
landed in another program's block, or in an input.

Two numeric gaps of the interpreter are closed while active, so that a CPU learner sees what a
GPU would do:

* ``tl.dot`` on float32 inputs with ``input_precision="tf32"`` (or none: TF32 is the default)
  rounds its inputs to TF32 (10 mantissa bits, round to nearest even) as the tensor cores do;
  the interpreter alone computes such dots exactly;
* float32 -> bfloat16 conversions round to nearest even; the interpreter alone truncates.

Nothing here runs unless a thread asks for it: the wrappers are installed while at least one
thread has a check active, and pass every call of other threads straight to Triton.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import os
import sys
import threading
from functools import partial
from typing import Iterator

import numpy as np

from .memory_report import (MAX_OFFSETS, Launch, MemcheckUnavailable, MemoryReport, Site, TensorArg,
                            Violation, WriteMap, decode_program, encode_program)

__all__ = ["MemcheckUnavailable", "MemoryReport", "decode_program", "encode_program",
           "hooks_installed", "interpreter_module", "mask_source", "memory_checked",
           "round_to_bf16_bits", "round_to_tf32"]


# ----------------------------------------------------------------------------------------------
# The learner's source: which line, and what its mask is.
# ----------------------------------------------------------------------------------------------
_REALPATHS: dict[str, str] = {}
_TREES: dict[tuple[str, float], ast.AST] = {}
_TRITON_DIR = ""
_NUMPY_DIR = os.path.dirname(np.__file__)
_THIS_FILE = os.path.realpath(__file__)


def _real(path: str) -> str:
    r = _REALPATHS.get(path)
    if r is None:
        r = _REALPATHS[path] = os.path.realpath(path) if not path.startswith("<") else path
    return r


def _is_library(path: str) -> bool:
    real = _real(path)
    return (path.startswith("<") or real == _THIS_FILE or (_TRITON_DIR and real.startswith(_TRITON_DIR))
            or real.startswith(_NUMPY_DIR) or real.startswith(os.path.dirname(os.__file__)))


def _source_lines(path: str) -> list[str]:
    import linecache

    return linecache.getlines(path)


def _caller_site(learner_file: str | None) -> Site | None:
    frame = sys._getframe(2)
    target = _real(learner_file) if learner_file else None
    while frame is not None:
        name = frame.f_code.co_filename
        if (target and _real(name) == target) or (not target and not _is_library(name)):
            lines = _source_lines(name)
            line = frame.f_lineno
            code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            return Site(name, line, code)
        frame = frame.f_back
    return None


def _caller_line(learner_file: str | None):
    """Where the current access is called from: each kernel frame on the stack as (file, line,
    bytecode offset), so that two loads on one line, or a helper called for two tensors, make
    different keys."""
    frame = sys._getframe(2)
    target = _real(learner_file) if learner_file else None
    key = []
    while frame is not None:
        name = frame.f_code.co_filename
        if (target and _real(name) == target) or (not target and not _is_library(name)):
            key.append((name, frame.f_lineno, frame.f_lasti))
        elif key:
            break
        frame = frame.f_back
    return tuple(key) or None


def _tree(path: str):
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return None
    if key not in _TREES:
        try:
            _TREES[key] = ast.parse("".join(_source_lines(path)) or open(path).read())
        except (SyntaxError, OSError, ValueError):
            _TREES[key] = None
    return _TREES[key]


def mask_source(site: Site | None, kind: str) -> str | None:
    """The source of the ``mask=`` of the load/store call at ``site``; a mask held in a variable
    is followed to its last assignment above the call, in the same function."""
    if site is None:
        return None
    tree = _tree(site.file)
    if tree is None:
        return None
    text = "".join(_source_lines(site.file))
    call = None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == kind
                and node.lineno <= site.line <= (node.end_lineno or node.lineno)):
            call = node
    if call is None:
        return None
    expr = next((k.value for k in call.keywords if k.arg == "mask"), None)
    position = 1 if kind == "load" else 2
    if expr is None and len(call.args) > position:
        expr = call.args[position]
    if expr is None:
        return None
    if isinstance(expr, ast.Name):
        best = None
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    fn.lineno <= site.line <= (fn.end_lineno or fn.lineno):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Assign) and node.lineno < call.lineno and any(
                            isinstance(t, ast.Name) and t.id == expr.id for t in node.targets):
                        if best is None or node.lineno > best.lineno:
                            best = node
        if best is not None:
            return f"{expr.id} = {ast.get_source_segment(text, best.value)}"
    return ast.get_source_segment(text, expr)


# ----------------------------------------------------------------------------------------------
# The hooks.
# ----------------------------------------------------------------------------------------------
_local = threading.local()
_lock = threading.Lock()
_users = 0
_originals: dict = {}


def _active() -> "_Run | None":
    return getattr(_local, "run", None)


def interpreter_module():
    """Triton's interpreter module, or MemcheckUnavailable saying why not."""
    global _TRITON_DIR
    try:
        import triton
        from triton.runtime import interpreter
    except Exception as exc:  # pragma: no cover - Triton is a dependency
        raise MemcheckUnavailable(f"Triton's interpreter cannot be imported: {exc}") from exc
    _TRITON_DIR = os.path.dirname(os.path.realpath(triton.__file__))
    builder = getattr(interpreter, "interpreter_builder", None)
    missing = [m for m in ("create_load", "create_masked_load", "create_store", "create_masked_store",
                           "create_dot", "cast_impl", "set_grid_dim")
               if not callable(getattr(builder, m, None))]
    executor = getattr(interpreter, "GridExecutor", None)
    if builder is None or missing or not callable(getattr(executor, "_init_args_hst", None)):
        raise MemcheckUnavailable(
            f"Triton {triton.__version__}'s interpreter lacks "
            + (", ".join(missing) if missing else "interpreter_builder / GridExecutor._init_args_hst")
            + ": bounds checks cannot be installed")
    params = list(inspect.signature(builder.create_masked_load).parameters)
    if params[:3] != ["ptrs", "mask", "other"]:
        raise MemcheckUnavailable(f"create_masked_load takes {params}: not the layout the bounds "
                                  "checks know")
    return interpreter


def _install() -> None:
    interp = interpreter_module()
    builder = interp.interpreter_builder
    executor = interp.GridExecutor
    orig = {name: getattr(builder, name) for name in
            ("create_load", "create_masked_load", "create_store", "create_masked_store", "create_dot",
             "cast_impl", "set_grid_dim")}
    orig["_init_args_hst"] = executor.__dict__["_init_args_hst"]
    own = {name: builder.__dict__[name] for name in orig if name in vars(builder)}  # set by others

    def create_load(ptr, *rest, **kw):
        run = _active()
        if run is None:
            return orig["create_load"](ptr, *rest, **kw)
        return run.load(orig["create_masked_load"], ptr, None, None, rest, kw)

    def create_masked_load(ptrs, mask, other, *rest, **kw):
        run = _active()
        if run is None:
            return orig["create_masked_load"](ptrs, mask, other, *rest, **kw)
        return run.load(orig["create_masked_load"], ptrs, mask, other, rest, kw)

    def create_store(ptr, value, *rest, **kw):
        run = _active()
        if run is None:
            return orig["create_store"](ptr, value, *rest, **kw)
        return run.store(orig["create_masked_store"], ptr, value, None, rest, kw)

    def create_masked_store(ptrs, value, mask, *rest, **kw):
        run = _active()
        if run is None:
            return orig["create_masked_store"](ptrs, value, mask, *rest, **kw)
        return run.store(orig["create_masked_store"], ptrs, value, mask, rest, kw)

    def create_dot(a, b, d, input_precision, *rest, **kw):
        run = _active()
        if run is not None and run.tf32 and _is_tf32(input_precision) and _is_fp32(a) and _is_fp32(b):
            run.report.tf32_dots += 1
            a = type(a)(round_to_tf32(a.data), a.dtype)
            b = type(b)(round_to_tf32(b.data), b.dtype)
        return orig["create_dot"](a, b, d, input_precision, *rest, **kw)

    def cast_impl(src, dst_type, *rest, **kw):
        run = _active()
        if run is not None and run.bf16 and _scalar_name(src.dtype) == "fp32" and \
                _scalar_name(dst_type) == "bf16":
            run.report.bf16_rounded += 1
            bits = round_to_bf16_bits(src.data)
            return type(src)(bits.view(interp._get_np_dtype(dst_type.scalar)), dst_type.scalar)
        return orig["cast_impl"](src, dst_type, *rest, **kw)

    def set_grid_dim(*dims):
        run = _active()
        if run is not None:
            run.grid = tuple(int(d) for d in dims)
            run.dims = max([i + 1 for i, g in enumerate(run.grid) if g > 1] or [1])
            if run.report.launches:
                run.report.launches[-1].grid = run.grid
        return orig["set_grid_dim"](*dims)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = orig["_init_args_hst"](self, args_dev, kwargs)
        run = _active()
        if run is not None:
            run.launching = True  # the next language patch is this launch's own
            names = list(getattr(self, "arg_names", []))
            pairs = [(names[i] if i < len(names) else f"arg{i}", d, h)
                     for i, (d, h) in enumerate(zip(args_dev, args_hst))]
            pairs += [(k, kwargs[k], kwargs_hst[k]) for k in kwargs_hst if k in kwargs]
            run.begin_launch(getattr(self.fn, "__name__", "kernel"), pairs)
        return args_hst, kwargs_hst

    for name, fn in (("create_load", create_load), ("create_masked_load", create_masked_load),
                     ("create_store", create_store), ("create_masked_store", create_masked_store),
                     ("create_dot", create_dot), ("cast_impl", cast_impl), ("set_grid_dim", set_grid_dim)):
        setattr(builder, name, fn)
    executor._init_args_hst = _init_args_hst
    if callable(getattr(interp, "_patch_lang", None)) and hasattr(interp, "_LangPatchScope"):
        orig["_patch_lang"] = interp._patch_lang
        interp._patch_lang = partial(_patch_lang, interp, interp._patch_lang)
    _originals.update(orig)
    _originals["builder"], _originals["executor"], _originals["own"] = builder, executor, own
    # Without debug the interpreter still computes an int64 overflow check for every integer
    # add, sub and mul, then drops it (device_assert is a no-op): about half the time of an
    # offset-heavy kernel. A GPU compile skips those checks without debug too.
    options = getattr(builder, "options", None)
    if options is not None and not getattr(options, "debug", True) and \
            getattr(options, "sanitize_overflow", False) and dataclasses.is_dataclass(options):
        _originals["options"] = options
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _uninstall() -> None:
    builder, executor = _originals.pop("builder"), _originals.pop("executor")
    own = _originals.pop("own")
    for name in ("create_load", "create_masked_load", "create_store", "create_masked_store", "create_dot",
                 "cast_impl", "set_grid_dim"):
        if name in own:
            setattr(builder, name, own[name])  # what someone else had put there
        elif name in builder.__dict__:
            del builder.__dict__[name]  # the class's own method shows again
        _originals.pop(name, None)
    executor._init_args_hst = _originals.pop("_init_args_hst")
    if "_patch_lang" in _originals:
        interpreter_module()._patch_lang = _originals.pop("_patch_lang")
    if "options" in _originals:
        builder.options = _originals.pop("options")


class _LaunchPatch:
    """A launch's language patch (Triton's scope): restoring it also ends the run's record."""

    def __init__(self, scope, run: "_Run | None"):
        self.scope, self.run = scope, run

    def restore(self) -> None:
        if self.run is not None:
            self.run.patched_langs = None
            self.scope.restore()


def _patch_lang(interp, patch_lang, fn):
    """Triton's ``_patch_lang``, skipped for a ``@triton.jit`` helper called in a checked launch
    that has patched the helper's language modules already. The interpreter patches
    ``triton.language`` for each launch, and again on every call of a helper inside it: a scan of
    every member of the modules, in a kernel that calls a helper in each program more time than
    the rest of the launch. Patching patched modules changes nothing; others are patched."""
    run = _active()
    if run is None:
        return patch_lang(fn)
    langs = {id(v) for v in fn.__globals__.values() if v is interp.tl or v is interp.tl.core}
    if run.launching:  # the launch's own patch, restored when the launch ends
        run.launching, run.patched_langs = False, langs
        return _LaunchPatch(patch_lang(fn), run)
    if langs and run.patched_langs is not None and langs <= run.patched_langs:
        return _LaunchPatch(None, None)  # nothing patched, nothing to restore
    if run.patched_langs is not None:
        run.patched_langs |= langs
    return patch_lang(fn)


def hooks_installed() -> bool:
    return "builder" in _originals


@contextlib.contextmanager
def memory_checked(learner_file: str | None = None, *, tf32: bool = True, bf16: bool = True
                   ) -> Iterator[MemoryReport]:
    """Within the block, this thread's interpreted kernels run bounds-checked; yields the report.

    Raises :class:`MemcheckUnavailable` if the installed Triton's interpreter cannot be hooked.
    """
    global _users
    if _active() is not None:
        raise RuntimeError("memory_checked is already active in this thread")
    with _lock:
        if _users == 0:
            _install()
        _users += 1
    report = MemoryReport(learner_file=learner_file)
    _local.run = _Run(report, learner_file, tf32=tf32, bf16=bf16)
    try:
        yield report
    finally:
        _local.run = None
        with _lock:
            _users -= 1
            if _users == 0:
                _uninstall()


# ----------------------------------------------------------------------------------------------
# Numerics the GPU has and the interpreter does not.
# ----------------------------------------------------------------------------------------------
def round_to_tf32(data: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits, nearest even); inf and NaN kept."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return np.where(special, bits, rounded).view(np.float32).reshape(np.shape(data))


def round_to_bf16_bits(data: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    nan = np.isnan(np.asarray(data, dtype=np.float32))
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = np.where(nan, np.uint32(0x7FC0) | ((bits >> np.uint32(16)) & np.uint32(0x8000)), rounded)
    return out.astype(np.uint16).reshape(np.shape(data))


def _scalar_name(dtype) -> str:
    scalar = getattr(dtype, "scalar", dtype)
    return getattr(scalar, "name", str(scalar))


def _is_fp32(handle) -> bool:
    return _scalar_name(handle.dtype) == "fp32"


def _is_tf32(precision) -> bool:
    name = getattr(precision, "name", str(precision)).split(".")[-1].upper()
    return name == "TF32"


# ----------------------------------------------------------------------------------------------
# One thread's checked run.
# ----------------------------------------------------------------------------------------------
class _Run:
    def __init__(self, report: MemoryReport, learner_file: str | None, *, tf32: bool, bf16: bool):
        self.report = report
        self.learner_file = learner_file
        self.tf32 = tf32
        self.bf16 = bf16
        self.grid = (1, 1, 1)
        self.dims = 1  # grid axes shown in program ids: up to the last one longer than 1
        self.tensors: list[TensorArg] = []
        self.kernel = "kernel"
        self.launching = False  # a launch began and has not patched the language yet
        self.patched_langs: set[int] | None = None  # what the launch under way patched

    # launches -------------------------------------------------------------------------------
    def begin_launch(self, kernel: str, pairs) -> None:
        tensors = []
        for name, dev, hst in pairs:
            if not (hasattr(hst, "data_ptr") and hasattr(hst, "untyped_storage")):
                continue
            try:
                base = int(hst.data_ptr())
                itemsize = int(hst.element_size())
                low = sum((s - 1) * st for s, st in zip(hst.shape, hst.stride()) if st < 0 and s > 0)
                high = sum((s - 1) * st for s, st in zip(hst.shape, hst.stride()) if st > 0 and s > 0)
                empty = hst.numel() == 0
                storage = hst.untyped_storage()
                tensors.append(TensorArg(
                    name=name, key=int(dev.data_ptr()), base=base,
                    lo=base + low * itemsize, hi=base if empty else base + (high + 1) * itemsize,
                    storage_lo=int(storage.data_ptr()), storage_hi=int(storage.data_ptr()) + storage.nbytes(),
                    itemsize=itemsize, shape=tuple(hst.shape), strides=tuple(hst.stride())))
            except Exception:  # a tensor subclass without storage: nothing to check against
                continue
        self.tensors = tensors
        self.line_owner: dict = {}  # (file, line) of a load/store -> the tensor it hit in bounds
        self.kernel = kernel
        self.report.launches.append(Launch(kernel, self.grid, [t.name for t in tensors],
                                           [t.key for t in tensors]))

    # the checks -----------------------------------------------------------------------------
    def _classify(self, addr: np.ndarray, itemsize: int):
        """Per lane: index of the tensor it lies in (-1: none)."""
        owner = np.full(addr.shape, -1, dtype=np.int64)
        for i, t in enumerate(self.tensors):
            inside = (addr >= t.lo) & (addr + itemsize <= t.hi) & (owner < 0)
            owner[inside] = i
        return owner

    def _aimed_at(self, addr_bad: np.ndarray, owner_good: np.ndarray, line_key) -> int:
        """Which tensor the stray lanes were aimed at: the one the access's other lanes hit, else
        the one this line hit before, else the one whose allocation holds the first stray
        address, else the nearest."""
        if owner_good.size:
            counts = np.bincount(owner_good, minlength=len(self.tensors))
            return int(counts.argmax())
        if line_key in self.line_owner:
            return self.line_owner[line_key]
        first = int(addr_bad[0])
        for i, t in enumerate(self.tensors):
            if t.storage_lo <= first < t.storage_hi:
                return i
        distance = [min(abs(first - t.lo), abs(first - t.hi)) for t in self.tensors]
        return int(np.argmin(distance))

    def _check(self, kind: str, ptrs, mask):
        """(active lanes, lanes to stop) as boolean arrays of the pointer block's shape."""
        data = np.asarray(ptrs.data)
        itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        active = np.ones(data.shape, dtype=bool) if mask is None else np.broadcast_to(
            np.asarray(mask.data, dtype=bool), data.shape)
        if not self.tensors:
            return active, None, itemsize
        addr = data.astype(np.uint64).astype(np.int64) if data.dtype != np.int64 else data
        owner = self._classify(addr, itemsize)
        bad = active & (owner < 0)
        line_key = _caller_line(self.learner_file)
        expected = self.line_owner.get(line_key)
        if expected is None:
            good = owner[active & ~bad]
            if good.size:
                self.line_owner[line_key] = int(np.bincount(good, minlength=len(self.tensors)).argmax())
        else:
            # One line's pointer comes from one argument: lanes that land in another tensor ran
            # past the end of this line's own one (into a neighbour's memory).
            bad = active & (owner != expected)
        if kind == "store":
            self._record_writes(addr[active & ~bad], owner[active & ~bad], itemsize)
        if not bad.any():
            return active, None, itemsize
        self._record_violation(kind, addr, active, bad, owner, mask is not None, line_key)
        return active, bad, itemsize

    def _record_writes(self, addr, owner, itemsize) -> None:
        if not addr.size:
            return
        program = encode_program(self.grid_idx())
        site = None
        for i in np.flatnonzero(np.bincount(owner)):  # np.unique would import numpy.ma: slow
            t = self.tensors[int(i)]
            if t.lo != t.base:  # negative strides: element numbers are not offsets from lo
                continue
            mine = addr[owner == i]
            elem = (mine - t.base) // t.itemsize
            wm = self.report.writes.get(t.key)
            if wm is None:
                span = int((t.hi - t.base) // t.itemsize)
                wm = WriteMap(np.full(span, -1, dtype=np.int64), np.zeros(span, dtype=np.int32))
                self.report.writes[t.key] = wm
            wm.writer[elem] = program
            np.add.at(wm.count, elem, 1)
            lo, hi, k = wm.spans.get(program, (int(elem.min()), int(elem.max()), 0))
            wm.spans[program] = (min(lo, int(elem.min())), max(hi, int(elem.max())), k + int(elem.size))
            sites = self.report.store_sites.setdefault(t.key, {})
            if site is None:
                site = _caller_site(self.learner_file) or Site("?", 0, "")
            sites.setdefault(site, t.name)

    def _record_violation(self, kind, addr, active, bad, owner, masked, line_key) -> None:
        target = self.tensors[self._aimed_at(addr[bad], owner[active & ~bad], line_key)]
        site = _caller_site(self.learner_file)
        key = (kind, site, target.name)
        v = self.report.violations.get(key)
        offsets = (addr[bad] - target.base) // target.itemsize
        pid = self.grid_idx()
        if v is None:
            v = Violation(kind, self.kernel, site, target, masked, mask_source(site, kind),
                          first_offsets=sorted(set(offsets.tolist()))[:256],
                          lowest=int(offsets.min()), highest=int(offsets.max()))
            self.report.violations[key] = v
        if pid not in v.seen:
            v.seen.add(pid)
            v.n_programs += 1
            if len(v.programs) < 64:
                v.programs.append(pid)
        v.lanes += int(bad.sum())
        v.lowest = min(v.lowest, int(offsets.min()))
        v.highest = max(v.highest, int(offsets.max()))
        room = MAX_OFFSETS - len(v.positions)
        if room > 0:
            code = encode_program(pid)
            v.positions.extend((int(o), code) for o in offsets[:room].tolist())

    def grid_idx(self) -> tuple:
        builder = _originals.get("builder")
        idx = getattr(builder, "grid_idx", None) or (0, 0, 0)
        return tuple(int(i) for i in idx)[:self.dims]

    # the wrapped builder methods ------------------------------------------------------------
    def load(self, masked_load, ptrs, mask, other, rest, kw):
        active, bad, _ = self._check("load", ptrs, mask)
        if mask is not None and other is None and not bool(np.all(active)):
            site = _caller_site(self.learner_file)
            if site is not None:
                self.report.no_other_sites[site] = self.report.no_other_sites.get(site, 0) + int(
                    (~active).sum())
        if bad is None:
            if mask is None:
                mask = type(ptrs)(active, _int1())
            return masked_load(ptrs, mask, other, *rest, **kw)
        interp = sys.modules["triton.runtime.interpreter"]
        element = ptrs.get_element_ty()
        np_dtype = interp._get_np_dtype(element)
        base = np.zeros(active.shape, dtype=np_dtype) if other is None else np.broadcast_to(
            np.asarray(other.data, dtype=np_dtype), active.shape)
        filled = np.where(bad, _poison(element, np_dtype), base).astype(np_dtype)
        return masked_load(ptrs, type(ptrs)(active & ~bad, _int1()), type(ptrs)(filled, element),
                           *rest, **kw)

    def store(self, masked_store, ptrs, value, mask, rest, kw):
        active, bad, _ = self._check("store", ptrs, mask)
        keep = active if bad is None else active & ~bad
        return masked_store(ptrs, value, type(ptrs)(np.ascontiguousarray(keep), _int1()), *rest, **kw)


def _int1():
    import triton.language as tl

    return tl.int1


def _poison(element, np_dtype):
    """What an out-of-bounds load reads: NaN for floats, the largest value for integers."""
    if np.dtype(np_dtype).kind == "f":
        return np.array(np.nan, dtype=np_dtype)
    name = _scalar_name(element)
    if name == "bf16":
        return np.array(0x7FC0, dtype=np_dtype)
    if np.dtype(np_dtype) == np.bool_:
        return np.array(True)
    if name.startswith("fp"):  # fp8 stored as uint8: all ones is a NaN in every fp8 format
        return np.array(0xFF, dtype=np_dtype)
    return np.array(np.iinfo(np_dtype).max, dtype=np_dtype)
