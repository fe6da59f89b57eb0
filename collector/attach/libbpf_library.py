"""The libbpf shared library through ctypes: its signatures, its messages as
LibbpfErrors, and the BTF structures read from it.

Why ctypes and not a C extension: the calls are few and none is on a hot
path (open, load, attach, detach; the ring is read by collector/attach/ringbuf.py),
libbpf 1.x keeps its ABI stable behind versioned symbols, and ctypes needs no
compiler where inferprobe is installed. The library is the distribution's
libbpf.so.1. Only what the probe sets use is bound. Objects, maps, programs
and links are collector/attach/libbpf.py's; tables over maps core_tables.py's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading

BTF_KIND_VAR = 14
BTF_KIND_DATASEC = 15
LIBBPF_WARN = 0


class LibbpfError(Exception):
    """libbpf or the kernel refused a step; the message says which and why."""


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size_or_type", ctypes.c_uint32)]


class _BtfVarSecinfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _OpenOpts(ctypes.Structure):
    """struct bpf_object_open_opts of libbpf 1.x, up to btf_custom_path."""
    _fields_ = [("sz", ctypes.c_size_t), ("object_name", ctypes.c_char_p), ("relaxed_maps", ctypes.c_bool),
                ("pin_root_path", ctypes.c_char_p), ("_removed_attach_prog_fd", ctypes.c_uint32),
                ("kconfig", ctypes.c_char_p), ("btf_custom_path", ctypes.c_char_p)]


# A BTF file for a kernel without its own (`--btf`, from BTFHub): libbpf relocates with it.
BTF_ENV = "INFERPROBE_BTF"
BTF_VMLINUX = "/sys/kernel/btf/vmlinux"  # the running kernel's own BTF, where it has one


class _UsdtOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("usdt_cookie", ctypes.c_uint64)]


class _UprobeOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ref_ctr_offset", ctypes.c_size_t), ("bpf_cookie", ctypes.c_uint64),
                ("retprobe", ctypes.c_bool), ("func_name", ctypes.c_char_p)]


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_lib: ctypes.CDLL | None = None
_libc = ctypes.CDLL(None, use_errno=True)
_messages = threading.local()


def _signatures(lib: ctypes.CDLL) -> None:
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    for name, restype, argtypes in (
        ("bpf_object__open_file", p, [s, p]),
        ("bpf_object__load", i, [p]),
        ("bpf_object__close", None, [p]),
        ("bpf_object__btf", p, [p]),
        ("bpf_object__find_map_by_name", p, [p, s]),
        ("bpf_object__find_program_by_name", p, [p, s]),
        ("bpf_map__reuse_fd", i, [p, i]),
        ("bpf_map__fd", i, [p]),
        ("bpf_map__initial_value", p, [p, ctypes.POINTER(ctypes.c_size_t)]),
        ("bpf_program__attach_usdt", p, [p, i, s, s, s, ctypes.POINTER(_UsdtOpts)]),
        ("bpf_program__attach_uprobe_opts", p, [p, i, s, ctypes.c_size_t, ctypes.POINTER(_UprobeOpts)]),
        ("bpf_map_update_elem", i, [i, p, p, ctypes.c_uint64]),
        ("bpf_map_lookup_elem", i, [i, p, p]),
        ("bpf_map_delete_elem", i, [i, p]),
        ("bpf_map_get_next_key", i, [i, p, p]),
        ("bpf_obj_get_info_by_fd", i, [i, p, ctypes.POINTER(ctypes.c_uint32)]),
        ("bpf_object__next_map", p, [p, p]),
        ("bpf_map__name", s, [p]),
        ("bpf_map__is_internal", ctypes.c_bool, [p]),
        ("bpf_map__type", i, [p]),
        ("bpf_map__key_size", ctypes.c_uint32, [p]),
        ("bpf_map__value_size", ctypes.c_uint32, [p]),
        ("bpf_map__max_entries", ctypes.c_uint32, [p]),
        ("bpf_map__btf_key_type_id", ctypes.c_uint32, [p]),
        ("bpf_map__btf_value_type_id", ctypes.c_uint32, [p]),
        ("bpf_program__set_autoload", i, [p, ctypes.c_bool]),
        ("bpf_program__attach", p, [p]),
        ("bpf_program__attach_tracepoint", p, [p, s, s]),
        ("bpf_program__attach_perf_event", p, [p, i]),
        ("libbpf_num_possible_cpus", i, []),
        ("libbpf_major_version", ctypes.c_uint32, []),
        ("libbpf_minor_version", ctypes.c_uint32, []),
        ("bpf_link__destroy", i, [p]),
        ("btf__find_by_name_kind", i, [p, s, ctypes.c_uint32]),
        ("btf__type_by_id", ctypes.POINTER(_BtfType), [p, ctypes.c_uint32]),
        ("btf__name_by_offset", s, [p, ctypes.c_uint32]),
        ("libbpf_set_print", p, [p]),
        ("libbpf_strerror", i, [i, s, ctypes.c_size_t]),
        ("bpf_object__next_program", p, [p, p]),
        ("bpf_program__name", s, [p]),
        ("bpf_program__section_name", s, [p]),
        ("bpf_program__autoload", ctypes.c_bool, [p]),
        ("bpf_program__fd", i, [p]),
        ("bpf_map__set_max_entries", i, [p, ctypes.c_uint32]),
        ("bpf_map_lookup_batch", i, [i, p, p, p, p, ctypes.POINTER(ctypes.c_uint32), p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def libbpf_version() -> str:
    """The libbpf in use, "1.1" say; "unknown" where it does not load."""
    try:
        lib = library()
    except LibbpfError:
        return "unknown"
    return f"{lib.libbpf_major_version()}.{lib.libbpf_minor_version()}"


def library() -> ctypes.CDLL:
    """libbpf.so.1, loaded once; LibbpfError when this host has none."""
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            _signatures(lib)
        except (OSError, AttributeError) as err:
            raise LibbpfError(f"libbpf 1.x is not usable here ({err}): install libbpf1 (apt) "
                              "or your distribution's libbpf package") from None
        _lib = lib
        # Process-wide, once: every warning goes to the calling thread's _Messages.
        lib.libbpf_set_print(ctypes.cast(_collect_message, ctypes.c_void_p))
    return _lib


@_PRINT_FN
def _collect_message(level: int, fmt: bytes, args: int) -> int:
    # libbpf hands a printf format and a va_list: vsnprintf from libc formats it.
    if level == LIBBPF_WARN:
        buf = ctypes.create_string_buffer(1 << 16)   # a verifier log comes as one message
        _libc.vsnprintf(buf, ctypes.c_size_t(len(buf)), fmt, ctypes.c_void_p(args))
        text = buf.value.decode(errors="replace").strip()
        if text:
            getattr(_messages, "lines", []).append(text)
    return 0


class _Messages:
    """Collects libbpf's warnings while a call runs in this thread, for the error
    it may raise. libbpf's print hook is process-wide and set once (library());
    the lines go to the calling thread's list, so objects loading on several
    threads at once keep their messages apart."""

    def __enter__(self) -> list[str]:
        _messages.lines = []
        return _messages.lines

    def __exit__(self, *exc) -> None:
        _messages.lines = []


def _strerror(code: int) -> str:
    """errno in words, and libbpf's own codes (4000 and up: a malformed object or BTF file)."""
    if code < 4000:
        return os.strerror(code)
    buf = ctypes.create_string_buffer(128)
    library().libbpf_strerror(code, buf, len(buf))
    return buf.value.decode(errors="replace")


def _verifier_refusal(lines: list[str]) -> str | None:
    """What the verifier said of the program it refused: the last line of its
    log before the statistics ("processed N insns"), with the program's name."""
    text = "\n".join(lines)
    if "-- END PROG LOAD LOG --" not in text:
        return None
    log = text.split("-- BEGIN PROG LOAD LOG --")[-1].split("-- END PROG LOAD LOG --")[0]
    said = [line.strip() for line in log.splitlines() if line.strip() and not line.startswith("processed ")]
    program = next((line.split("'")[1] for line in lines
                    if "BPF program load failed" in line and "'" in line), "?")
    return f"the verifier refused program {program}: {said[-1]}" if said else None


def _failure(what: str, lines: list[str], code: int) -> LibbpfError:
    """libbpf's last warning, which names the step (or the verifier's verdict),
    and the errno in words (libbpf prints -22)."""
    words = _strerror(code or errno.EINVAL)
    # libbpf ends a failed load with "failed to load object": the first warning
    # of the run is the cause (an unreadable --btf file, a relocation that failed).
    said = lines[:1] if lines and "failed to load object" in lines[-1] else lines[-1:]
    why = _verifier_refusal(lines) or (said[0].removeprefix("libbpf: ").rstrip(".") if said else words)
    if words not in why:
        why = f"{why} ({words})"
    if code in (errno.EACCES, errno.EPERM) and "USDT" in what and not holds_cap_sys_admin():
        # libbpf 1.1 creates USDT probes through perf_event_open only (plain uprobes fall back to tracefs)
        why += "; Linux 6.16+ refuses perf uprobes without CAP_SYS_ADMIN: grant it (docs/deploy.md)"
    return LibbpfError(f"{what}: {why}")


CAP_SYS_ADMIN = 21


def holds_cap_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def map_id_of_fd(fd: int) -> int:
    """The kernel's id of the map behind fd (struct bpf_map_info's second field)."""
    info = (ctypes.c_uint32 * 32)()   # struct bpf_map_info: type, id, ...
    size = ctypes.c_uint32(ctypes.sizeof(info))
    if library().bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)) != 0:
        raise LibbpfError(f"the map behind fd {fd} gives no info ({os.strerror(ctypes.get_errno())})")
    return info[1]
