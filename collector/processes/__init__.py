"""Processes: which processes to trace and what the kernel and /proc say of them.

The given pids and their descendants (targets), every serving process on the
host (host_wide), where each runs (containers), and what user space can read
of a live process: its mappings (proc_maps), its TCP sockets' state
(tcp_state), its socketpairs (unix_peers).
"""
