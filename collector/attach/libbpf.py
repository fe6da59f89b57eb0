"""libbpf's objects, maps, programs and links: load the BPF objects built ahead
of time and attach them (the library itself, through ctypes:
collector/attach/libbpf_library.py).

Every failure becomes a LibbpfError whose message carries libbpf's own last
warning, which says what the kernel or the object refused.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from inferprobe.collector.attach.libbpf_library import (
    BTF_ENV,
    BTF_KIND_DATASEC,
    BTF_KIND_VAR,
    LibbpfError,
    _BtfType,
    _BtfVarSecinfo,
    _failure,
    _Messages,
    _OpenOpts,
    _UprobeOpts,
    _UsdtOpts,
    holds_cap_sys_admin,
    library,
    map_id_of_fd,
)


class Link:
    """One attachment (a probe in one process); destroy() detaches it."""

    def __init__(self, ptr: int, what: str, after_destroy: Callable[[], None] | None = None) -> None:
        self.ptr: int | None = ptr
        self.what = what
        self.after_destroy = after_destroy   # what goes with it (a tracefs uprobe event)

    def destroy(self) -> None:
        if self.ptr is not None:
            library().bpf_link__destroy(self.ptr)
            self.ptr = None
            if self.after_destroy is not None:
                try:
                    self.after_destroy()
                except OSError:
                    pass   # a tracefs line another tracer removed: nothing is left to undo


def destroy_all(links: list[Link]) -> None:
    """Detaches links from threads at once: each detach waits for the kernel
    to retire the program from the probe (an RCU grace period, ~60 ms on the
    test VM); ctypes releases the GIL, so the waits overlap."""
    if len(links) < 2:
        for link in links:
            link.destroy()
        return
    with ThreadPoolExecutor(max_workers=min(32, len(links))) as pool:
        list(pool.map(Link.destroy, links))


class BpfObject:
    """One built object (bpf/build/<name>.bpf.o): opened, configured, loaded, attached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = library()
        custom_btf = os.environ.get(BTF_ENV)
        opts = _OpenOpts(sz=ctypes.sizeof(_OpenOpts), btf_custom_path=os.fsencode(custom_btf)) \
            if custom_btf else None
        with _Messages() as lines:
            ptr = lib.bpf_object__open_file(os.fsencode(path),
                                            ctypes.byref(opts) if opts is not None else None)
        if not ptr:
            raise _failure(f"libbpf could not open {path}", lines, ctypes.get_errno())
        self.ptr: int | None = ptr
        self.loaded = False
        self.links: list[Link] = []   # every attachment made, detached at close()
        self._tables: dict[str, Any] = {}   # name -> CoreTable, made once (its types come from BTF)
        self._shareable: list[str] | None = None
        self.constants: dict[str, int] = {}   # the read-only settings written before load
        self.parts: list[BpfObject] = []   # copies that loaded some of its programs (load_apart)
        self._reused: set[str] = set()   # maps handed over from an object loaded before
        self._attached: dict[str, Link] = {}   # program -> its link from attach()

    def _map(self, name: str) -> int:
        assert self.ptr is not None, "the object is closed"
        ptr = library().bpf_object__find_map_by_name(self.ptr, name.encode())
        if not ptr:
            raise LibbpfError(f"{self.path.name} has no map {name}")
        return ptr

    def reuse_map(self, name: str, fd: int) -> None:
        """Before load: use an existing map (by fd) for the object's map of that name."""
        if library().bpf_map__reuse_fd(self._map(name), fd) != 0:
            raise LibbpfError(f"{self.path.name}: map {name} cannot take fd {fd} "
                              f"({os.strerror(ctypes.get_errno())})")
        self._reused.add(name)

    def map_fd(self, name: str) -> int:
        return library().bpf_map__fd(self._map(name))

    def shareable_maps(self) -> list[str]:
        """The maps another object may share by name: not libbpf's internal ones
        (.rodata and the like, and its USDT bookkeeping, named __bpf_*). An object's maps
        are fixed once it is opened: read once."""
        if self._shareable is None:
            lib, names, at = library(), [], None
            while at := lib.bpf_object__next_map(self.ptr, at):
                name = lib.bpf_map__name(at).decode()
                if not lib.bpf_map__is_internal(at) and not name.startswith("__"):
                    names.append(name)
            self._shareable = names
        return self._shareable

    def map_id(self, name: str) -> int:
        """The kernel's id of the map: one map however many fds or objects name it."""
        return map_id_of_fd(self.map_fd(name))

    def __getitem__(self, name: str | bytes):
        """The named map as a table (collector/attach/core_tables.py), made once per name."""
        from inferprobe.collector.attach.core_tables import table

        key = os.fsdecode(name)
        if key not in self._tables:
            self._tables[key] = table(self, key)
        return self._tables[key]

    def set_autoload(self, program: str, load: bool) -> None:
        """Before load: leave a program out (its tracepoint is not in this kernel, say)."""
        library().bpf_program__set_autoload(self._program(program), load)

    def set_constant(self, name: str, value: int) -> None:
        """Before load: the value of a `const volatile` integer in .rodata,
        found by name in the object's BTF (the verifier then sees a constant)."""
        lib = library()
        assert self.ptr is not None and not self.loaded, "constants are set between open and load"
        btf = lib.bpf_object__btf(self.ptr)
        section_id = lib.btf__find_by_name_kind(btf, b".rodata", BTF_KIND_DATASEC)
        if section_id < 0:
            raise LibbpfError(f"{self.path.name} has no read-only globals")
        section = lib.btf__type_by_id(btf, section_id)
        vlen = section.contents.info & 0xFFFF
        entries = ctypes.cast(ctypes.addressof(section.contents) + ctypes.sizeof(_BtfType),
                              ctypes.POINTER(_BtfVarSecinfo * vlen)).contents
        for entry in entries:
            var = lib.btf__type_by_id(btf, entry.type).contents
            if (var.info >> 24) & 0x1F == BTF_KIND_VAR \
                    and lib.btf__name_by_offset(btf, var.name_off) == name.encode():
                size = ctypes.c_size_t()
                data = lib.bpf_map__initial_value(self._map(".rodata"), ctypes.byref(size))
                if not data or entry.offset + entry.size > size.value:
                    raise LibbpfError(f"{self.path.name}: .rodata is not writable before load")
                raw = value.to_bytes(entry.size, "little", signed=value < 0)
                ctypes.memmove(data + entry.offset, raw, entry.size)
                self.constants[name] = value
                return
        raise LibbpfError(f"{self.path.name} has no read-only global {name}")

    def set_max_entries(self, name: str, entries: int) -> None:
        """Before load: the size of one of the object's own maps (a ring's bytes).
        A map reused from an object loaded before has its size already: asking for
        another is a mistake in the load order, said rather than ignored."""
        if name in self._reused:
            made = library().bpf_map__max_entries(self._map(name))
            if made != entries:
                raise LibbpfError(f"{self.path.name}: map {name} was made with {made} entries by an "
                                  f"object loaded before, not the {entries} asked for here")
            return
        if library().bpf_map__set_max_entries(self._map(name), entries) != 0:
            raise LibbpfError(f"{self.path.name}: map {name} cannot hold {entries} entries "
                              f"({os.strerror(ctypes.get_errno())})")

    def programs(self) -> dict[str, str]:
        """Every program of the object: name -> its section (\"tracepoint/sched/...\")."""
        lib, out, at = library(), {}, None
        while at := lib.bpf_object__next_program(self.ptr, at):
            out[lib.bpf_program__name(at).decode()] = lib.bpf_program__section_name(at).decode()
        return out

    def autoloads(self, program: str) -> bool:
        return bool(library().bpf_program__autoload(self._program(program)))

    def program_fd(self, program: str) -> int:
        """The loaded program's fd (a tail call's target goes into a program array by it)."""
        fd = library().bpf_program__fd(self._program(program))
        if fd < 0:
            raise LibbpfError(f"{self.path.name}: program {program} is not loaded")
        return fd

    def load(self) -> None:
        """Creates the object's own maps and has the kernel verify its programs."""
        assert self.ptr is not None, "the object is closed"
        with _Messages() as lines:
            rc = library().bpf_object__load(self.ptr)
        if rc != 0:
            raise _failure(f"the kernel refused {self.path.name}", lines, -rc)
        self.loaded = True

    def load_apart(self, groups: list[list[str]]) -> dict[str, BpfObject]:
        """After load: loads programs this object left out (set_autoload False),
        each group in a copy of the object opened from the same file, the
        groups on threads at once. Returns program name -> the copy holding it.

        Why: bpf_object__load has the kernel verify one program after another,
        and a few of the socket set's programs take most of a second each. The
        bpf() call runs without the GIL (ctypes), so copies verify on every
        core at once. A copy uses this object's maps (by fd) and its settings,
        so its programs work on the same state; it is kept in self.parts until
        close_parts() or close()."""
        assert self.loaded, "load the object itself first: the copies take its maps"

        def load_group(group: list[str]) -> BpfObject:
            part = BpfObject(self.path)
            try:
                for map_name in part.shareable_maps():
                    part.reuse_map(map_name, self.map_fd(map_name))
                for name, value in self.constants.items():
                    part.set_constant(name, value)
                wanted = set(group)
                for program in part.programs():
                    part.set_autoload(program, program in wanted)
                part.load()
            except Exception:
                part.close()
                raise
            return part

        groups = [group for group in groups if group]
        if not groups:
            return {}
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            futures = [pool.submit(load_group, group) for group in groups]
            parts, failure = [], None
            for future in futures:
                try:
                    parts.append(future.result())
                except Exception as err:  # LibbpfError: the first refusal is the one said
                    failure = failure or err
        self.parts.extend(parts)
        if failure is not None:
            raise failure
        return {program: part for group, part in zip(groups, parts, strict=True) for program in group}

    def close_parts(self) -> None:
        """Frees the copies load_apart made (each holds its own copy of the object's
        BTF and program text, ~10 MB for sock.bpf.o). A program of theirs that a
        program array holds stays loaded: the array keeps its own reference."""
        for part in self.parts:
            part.close()
        self.parts.clear()

    def attach_tracepoints(self) -> list[Link]:
        """Attaches every loaded program whose section names a tracepoint
        (SEC(\"tracepoint/<category>/<name>\")); a bare SEC(\"tracepoint\") is a tail
        call's target and is attached nowhere."""
        return [self.attach(program) for program, section in self.programs().items()
                if section.count("/") == 2 and section.startswith("tracepoint/") and self.autoloads(program)]

    def _program(self, name: str) -> int:
        assert self.ptr is not None, "the object is closed"
        ptr = library().bpf_object__find_program_by_name(self.ptr, name.encode())
        if not ptr:
            raise LibbpfError(f"{self.path.name} has no program {name}")
        return ptr

    def attach_usdt(self, program: str, pid: int, binary: str, provider: str, probe: str,
                    cookie: int) -> Link:
        """Attaches program to one USDT probe of binary in pid; libbpf reads the
        probe's notes (address, semaphore, arguments) from the file itself."""
        opts = _UsdtOpts(ctypes.sizeof(_UsdtOpts), cookie)
        with _Messages() as lines:
            ptr = library().bpf_program__attach_usdt(self._program(program), pid, os.fsencode(binary),
                                                     provider.encode(), probe.encode(), ctypes.byref(opts))
        what = f"USDT probe {provider}:{probe} of pid {pid} ({binary})"
        if not ptr:
            raise _failure(f"libbpf could not attach the {what}", lines, ctypes.get_errno())
        return self._keep(Link(ptr, what))

    def attach_uprobe(self, program: str, pid: int, binary: str, file_offset: int,
                      on_return: bool = False) -> Link:
        """Attaches program at file_offset of binary (a uretprobe with on_return), in pid only."""
        opts = _UprobeOpts(sz=ctypes.sizeof(_UprobeOpts), retprobe=on_return)
        with _Messages() as lines:
            ptr = library().bpf_program__attach_uprobe_opts(self._program(program), pid, os.fsencode(binary),
                                                            file_offset, ctypes.byref(opts))
        what = f"{'uretprobe' if on_return else 'uprobe'} at {binary}+0x{file_offset:x} in pid {pid}"
        if ptr:
            return self._keep(Link(ptr, what))
        code = ctypes.get_errno()
        if code in (errno.EACCES, errno.EPERM) and not holds_cap_sys_admin():
            return self._attach_uprobe_through_tracefs(program, pid, binary, file_offset, on_return, what)
        raise _failure(f"libbpf could not attach the {what}", lines, code)

    def _attach_uprobe_through_tracefs(self, program: str, pid: int, binary: str, file_offset: int,
                                       on_return: bool, what: str) -> Link:
        """Linux 6.16+ refuses perf uprobes without CAP_SYS_ADMIN: the uprobe is made as a
        tracefs event instead (collector/attach/tracefs_uprobes.py says why and how)."""
        from inferprobe.collector.attach import tracefs_uprobes

        try:
            event = tracefs_uprobes.open_uprobe(binary, file_offset, pid, on_return)
        except OSError as err:
            raise LibbpfError(f"the kernel refused the {what}: perf_event_open needs CAP_SYS_ADMIN on "
                              f"Linux 6.16+, and through tracefs: {err.strerror or err}") from None
        try:
            link = self.attach_perf_event(program, event.perf_fd)
        except LibbpfError:
            event.remove()
            raise
        link.what, link.after_destroy = f"{what} (a tracefs event)", event.remove
        return link

    def attach(self, program: str) -> Link:
        """Attaches program where its section names (SEC("tracepoint/cat/name"), ...),
        once: an object several sets use (ProbeSet.uses_objects) may be asked twice."""
        if (done := self._attached.get(program)) is not None and done.ptr is not None:
            return done
        with _Messages() as lines:
            ptr = library().bpf_program__attach(self._program(program))
        if not ptr:
            raise _failure(f"libbpf could not attach {program}", lines, ctypes.get_errno())
        self._attached[program] = self._keep(Link(ptr, program))
        return self._attached[program]

    def attach_tracepoint(self, program: str, category: str, event: str) -> Link:
        with _Messages() as lines:
            ptr = library().bpf_program__attach_tracepoint(self._program(program), category.encode(),
                                                           event.encode())
        if not ptr:
            raise _failure(f"libbpf could not attach {program} to {category}:{event}", lines,
                           ctypes.get_errno())
        return self._keep(Link(ptr, f"{category}:{event}"))

    def attach_perf_event(self, program: str, perf_fd: int) -> Link:
        """Attaches program to an open perf event; the link owns the event's fd from then on."""
        with _Messages() as lines:
            ptr = library().bpf_program__attach_perf_event(self._program(program), perf_fd)
        if not ptr:
            os.close(perf_fd)
            raise _failure(f"libbpf could not attach {program} to a perf event", lines, ctypes.get_errno())
        return self._keep(Link(ptr, f"perf event {perf_fd}"))

    def _keep(self, link: Link) -> Link:
        if len(self.links) % 256 == 255:   # now and then, forget the ones destroyed since
            self.links = [kept for kept in self.links if kept.ptr is not None]
        self.links.append(link)
        return link

    def close(self) -> None:
        """Detaches what is still attached (at once: destroy_all), then frees the object."""
        destroy_all([link for link in self.links if link.ptr is not None])
        self.links.clear()
        self._attached.clear()
        self._tables.clear()
        self.close_parts()
        if self.ptr is not None:
            library().bpf_object__close(self.ptr)
            self.ptr = None
