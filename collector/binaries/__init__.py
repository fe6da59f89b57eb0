"""Binaries: what a process's files say, found from the files alone.

One ELF reader (elf_symbols) and one symbolizer; where to probe Go's
crypto/tls (go_*), CPython's frames and threads (python_*, cpython_runtime),
llama.cpp's engine API (llama_api), the TLS libraries a process maps
(tls_libraries), where the CUPTI shim is built (cupti_shim), and the
cheapest point for a uprobe in a small C function (uprobe_points).
"""
