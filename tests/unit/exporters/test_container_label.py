"""The container_id label: on only where containers are traced, "" for a process in none, capped."""

from inferprobe.collector.model.process_identity import ContainerInfo, ProcessIdentity
from inferprobe.collector.model.timeline import Outcome, Request
from inferprobe.exporters import metrics as m

CID = "cd" * 32


def _req(process: ProcessIdentity | None) -> Request:
    return Request(pid=42, tid=42, conn=1, method="POST", path="/v1/completions", t_ingress_ns=0, status=200,
                   outcome=Outcome.COMPLETE, t_response_start_ns=10, t_end_ns=20, process=process)


def test_requests_are_labelled_by_container_when_asked():
    metrics = m.Metrics({42: "server"}, container_label=True)
    metrics.request_finished(_req(ProcessIdentity(42, 1, "/docker/" + CID, ContainerInfo(CID, "docker"))))
    metrics.request_finished(_req(ProcessIdentity(42, None, "/", None)))
    base = {"endpoint": "POST /v1/completions", "model": "", "status_class": "2xx", "target": "server"}
    get = metrics.registry.get_sample_value
    assert get("inferprobe_requests_total", {**base, "container_id": CID}) == 1
    assert get("inferprobe_requests_total", {**base, "container_id": ""}) == 1


def test_off_by_default_and_capped():
    plain = m.Metrics({42: "server"})
    plain.request_finished(_req(None))
    assert plain.registry.get_sample_value("inferprobe_requests_total", {
        "endpoint": "POST /v1/completions", "model": "", "status_class": "2xx", "target": "server"}) == 1
    capped = m.Metrics({42: "server"}, container_label=True)
    for i in range(m.MAX_CONTAINERS + 5):
        cid = f"{i:064x}"
        process = ProcessIdentity(42, None, "/docker/" + cid, ContainerInfo(cid, "docker"))
        capped.request_finished(_req(process))
    values = {s.labels["container_id"] for s in capped.requests.collect()[0].samples}
    assert len(values) == m.MAX_CONTAINERS + 1 and "other" in values
