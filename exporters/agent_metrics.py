"""The agent's own gauges beside the request metrics: sampling, cost, ring."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge

from inferprobe.exporters.metrics import Metrics


class AgentMetrics:
    def __init__(self, metrics: Metrics):
        r = metrics.registry
        self.follow_ratio = Gauge(
            "inferprobe_connection_sample_ratio",
            "Share of new connections followed in full (1: all; lower when over the CPU budget). "
            "Request metrics count followed connections only.", registry=r)
        self.accepted = Gauge("inferprobe_connections_accepted",
                              "Connections the traced servers accepted (every one, counted in the kernel).",
                              registry=r)
        self.followed = Gauge("inferprobe_connections_followed",
                              "Of those, connections followed in full.", registry=r)
        self.cpu = Gauge("inferprobe_cpu_share", "CPU the tracing costs (BPF programs + agent), 1 = one CPU.",
                         ["part"], registry=r)
        self.cpu_budget = Gauge("inferprobe_cpu_budget_share", "The --max-cpu budget, 1 = one CPU.",
                                registry=r)
        self.servers = Gauge("inferprobe_servers_followed", "Processes followed as HTTP servers.", registry=r)
        self.ring_bytes = Gauge("inferprobe_ring_bytes", "Bytes of recordings kept in the ring.", registry=r)
        self.attach_failures = Counter(
            "inferprobe_attach_failures",
            "Uprobe attaches that failed for one process (its TLS, Go TLS or USDT probes, by probe set); "
            "the process's other probes and every other process are still traced.",
            ["probe_set"], registry=r)
        self._failures_counted: dict[str, int] = {}

    def update(self, sample: dict, counters: dict[str, int], servers: int, ring_bytes: int,
               budget: float | None) -> None:
        self.follow_ratio.set(sample["follow_ratio"])
        self.accepted.set(counters.get("conns_accepted", 0))
        self.followed.set(counters.get("conns_followed", 0))
        self.cpu.labels("bpf").set(sample["bpf_cpu_share"])
        self.cpu.labels("collector").set(sample["collector_cpu_share"])
        if budget is not None:
            self.cpu_budget.set(budget)
        self.servers.set(servers)
        self.ring_bytes.set(ring_bytes)

    def set_attach_failures(self, by_set: Mapping[str, int]) -> None:
        for probe_set, total in by_set.items():
            new = total - self._failures_counted.get(probe_set, 0)
            if new > 0:
                self.attach_failures.labels(probe_set).inc(new)
                self._failures_counted[probe_set] = total
