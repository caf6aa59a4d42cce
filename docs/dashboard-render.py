#!/usr/bin/env python3
"""Renders the chart's Grafana dashboard (charts/cloud-controller-manager/files/dashboard.json)
from a real run, for docs/dashboard.md (issue #34 point 6).

No Grafana here (no registry serves it), so this is the small renderer: a real Prometheus
(Debian's `prometheus` package) scrapes the manager of `ci/demo <cloud> --chart` (the manager
as the chart installs it, its /metrics read with the token of the scraper the chart's
serviceMonitor RBAC names) every 5 s while this script works the cluster (Services created,
changed and deleted, a Node deleted and registered again); then every panel's own PromQL
queries, taken from dashboard.json with `$job` and `$__rate_interval` substituted as Grafana
would, are evaluated by that Prometheus over the run (`/api/v1/query_range`) and drawn with
matplotlib in the dashboard's grid (gridPos), titles and legends.

    apt-get install prometheus                        # Debian's Prometheus (any 2.x)
    python3 -m venv ~/.cache/ccm-rs/dashboard-venv
    ~/.cache/ccm-rs/dashboard-venv/bin/pip install matplotlib
    ~/.cache/ccm-rs/dashboard-venv/bin/python docs/dashboard-render.py [--cloud openstack]

Writes docs/dashboard.png (--out) and prints what it did and the figures it drew.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(REPO, "charts/cloud-controller-manager/files/dashboard.json")
JOB = "cloud-controller-manager"
SCRAPE = 5  # seconds
# Grafana's $__rate_interval: max(4 x scrape interval, query step + scrape interval).
RATE_INTERVAL = f"{4 * SCRAPE}s"


def log(msg):
    print(f"dashboard: {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, pred, timeout):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(1)
    sys.exit(f"dashboard: {what}: not within {timeout} s")


class Run:
    """`ci/demo <cloud> --chart` and a Prometheus scraping its manager."""

    def __init__(self, cloud, work, demo):
        self.cloud, self.work = cloud, work
        self.kubeconfig = os.path.join(work, "kubeconfig")
        tools = subprocess.run([os.path.join(REPO, "ci/install-tools"), "--print-dir"],
                               check=True, capture_output=True, text=True).stdout.strip()
        self.kubectl = os.path.join(tools, "kubectl")
        self.out = open(os.path.join(work, "demo.out"), "w+")
        self.err = open(os.path.join(work, "demo.err"), "w")
        log(f"ci/demo {cloud} --chart (builds first)")
        self.demo = subprocess.Popen(
            [demo, cloud, "--chart", "--kubeconfig", self.kubeconfig],
            stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL, start_new_session=True)
        self.prom = None

    def demo_output(self):
        with open(self.out.name) as f:
            return f.read()

    def wait_ready(self):
        def ready():
            if self.demo.poll() is not None:
                sys.exit(f"dashboard: ci/demo exited:\n{self.demo_output()}\n"
                         f"{open(self.err.name).read()}")
            return "press Ctrl-C" in self.demo_output()
        wait("ci/demo ready", ready, 1800)
        text = self.demo_output()
        m = re.search(r"^metrics: +(\S+) \(bearer token of kube-system/demo-scraper: (.+)\)$",
                      text, re.M)
        if not m:
            sys.exit(f"dashboard: ci/demo printed no metrics line:\n{text}")
        self.metrics_url, self.token_file = m.group(1), m.group(2)
        log(f"manager /metrics at {self.metrics_url}")

    def start_prometheus(self):
        prometheus = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
        if not prometheus:
            sys.exit("dashboard: no prometheus (apt-get install prometheus, or PROMETHEUS=path)")
        u = urllib.parse.urlparse(self.metrics_url)
        config = os.path.join(self.work, "prometheus.yml")
        with open(config, "w") as f:
            json.dump({  # JSON is YAML
                "global": {"scrape_interval": f"{SCRAPE}s", "evaluation_interval": f"{SCRAPE}s"},
                "scrape_configs": [{
                    "job_name": JOB, "scheme": "https", "metrics_path": u.path,
                    "tls_config": {"insecure_skip_verify": True},
                    "authorization": {"credentials_file": self.token_file},
                    "static_configs": [{"targets": [u.netloc]}],
                }],
            }, f)
        self.prom_url = f"http://127.0.0.1:{free_port()}"
        self.prom = subprocess.Popen(
            [prometheus, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(self.work, 'tsdb')}",
             f"--web.listen-address={self.prom_url[len('http://'):]}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, "prom.log"), "w"),
            start_new_session=True)
        out = wait("Prometheus scrapes the manager", lambda: self.up(), 60)
        log(f"Prometheus {self.prom_url} scrapes it every {SCRAPE} s ({out})")

    def up(self):
        try:
            r = self.query("up")
        except OSError:
            return None
        return r and r[0]["value"][1] == "1" and "up=1"

    def api(self, path, **params):
        url = f"{self.prom_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]["result"]

    def query(self, expr):
        return self.api("query", query=expr)

    def k(self, *args, stdin=None):
        return subprocess.run([self.kubectl, "--kubeconfig", self.kubeconfig, *args],
                              input=stdin, capture_output=True, text=True, check=True).stdout

    def stop(self):
        for p, sig in ((self.prom, signal.SIGTERM), (self.demo, signal.SIGTERM)):
            if p and p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                    p.wait(timeout=60)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass


def kubelet_node(name, ip):
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized",
                             "value": "true", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                 {"type": "Hostname", "address": name}],
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": now, "lastTransitionTime": now}]}})


def work_the_cluster(run, minutes):
    """What happens on the dashboard: load balancers created, changed and deleted; a Node
    leaves and registers again (initialised anew)."""
    nodes = json.loads(run.k("get", "nodes", "-o", "json"))["items"]
    node = nodes[-1]
    name = node["metadata"]["name"]
    ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    steps = [
        (20, "create Service web-2 (type LoadBalancer)",
         lambda: run.k("create", "service", "loadbalancer", "web-2", "--tcp=443:8443")),
        (50, f"delete Node {name}", lambda: run.k("delete", "node", name)),
        (70, f"register Node {name} again (kubelet-style, uninitialised)",
         lambda: run.k("create", "-f", "-", stdin=kubelet_node(name, ip))),
        (100, "change Service web's ports",
         lambda: run.k("patch", "service", "web", "--type=json", "-p",
                       '[{"op":"add","path":"/spec/ports/-","value":'
                       '{"name":"https","port":443,"targetPort":8443,"protocol":"TCP"}}]')),
        (130, "create Service web-3", lambda: run.k("create", "service", "loadbalancer", "web-3",
                                                     "--tcp=80:8080")),
        (160, "delete Service web-2", lambda: run.k("delete", "service", "web-2")),
        (190, "delete Service web-3", lambda: run.k("delete", "service", "web-3")),
    ]
    start = time.time()
    for at, what, act in steps:
        time.sleep(max(0, start + at - time.time()))
        act()
        log(f"t={int(time.time() - start):>3} s: {what}")
    time.sleep(max(0, start + minutes * 60 - time.time()))
    return start


# Grafana units the dashboard uses: (scale, axis label).
UNITS = {"short": (1, ""), "ops": (1, "per second"), "reqps": (1, "requests/s"),
         "s": (1, "seconds"), "bytes": (1 / 2**20, "MiB"), "percentunit": (100, "% of a core")}


def field_config(panel, legend):
    """(unit, axis placement) of a series: the panel's defaults and its byRegexp overrides."""
    fc = panel.get("fieldConfig", {})
    unit, placement = fc.get("defaults", {}).get("unit", "short"), "left"
    for o in fc.get("overrides", []):
        m = o.get("matcher", {})
        if m.get("id") == "byRegexp" and re.fullmatch(m.get("options", ""), legend):
            for prop in o.get("properties", []):
                if prop["id"] == "unit":
                    unit = prop["value"]
                elif prop["id"] == "custom.axisPlacement":
                    placement = prop["value"]
    return unit, placement


def panel_series(run, panel, start, end):
    """[(legend, [t], [v])] for each target of the panel, as Grafana would query it."""
    out = []
    for t in panel.get("targets", []):
        expr = t["expr"].replace("$job", JOB).replace("$__rate_interval", RATE_INTERVAL)
        for r in run.api("query_range", query=expr, start=start, end=end, step=SCRAPE):
            labels = r["metric"]
            legend = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""),
                            t.get("legendFormat") or expr)
            ts = [float(x) - start for x, _ in r["values"]]
            vs = [float(v) for _, v in r["values"]]
            out.append((legend.strip(), ts, vs))
    return out


def render(run, dashboard, start, end, path, cloud):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit = 0.2  # inches per grid row (Grafana: 30 px)
    width = 16.0
    fig = plt.figure(figsize=(width, rows * unit + 0.8), dpi=72, facecolor="#111217")
    fig.suptitle(f"{dashboard['title']}: ci/demo {cloud} --chart, "
                 f"{int((end - start) / 60)} min scraped every {SCRAPE} s by Prometheus",
                 color="#ccccdc", fontsize=13, x=0.01, ha="left", y=0.995)
    top = 1 - 0.8 / (rows * unit + 0.8)
    figures = {}
    for p in panels:
        g = p["gridPos"]
        left, w = g["x"] / 24, g["w"] / 24
        bottom = top * (1 - (g["y"] + g["h"]) / rows)
        h = top * g["h"] / rows
        ax = fig.add_axes([left + 0.035, bottom + 0.03, w - 0.075, h - 0.058],
                          facecolor="#181b1f")
        ax.set_title(p["title"], color="#ccccdc", fontsize=10, loc="left")
        for s in ax.spines.values():
            s.set_color("#2c3235")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        series = panel_series(run, p, start, end)
        figures[p["title"]] = len(series)
        if p["type"] == "stat":
            ax.set_xticks([])
            ax.set_yticks([])
            n = max(len(series), 1)
            for i, (legend, _, vs) in enumerate(series):
                ax.text((i + 0.5) / n, 0.55, f"{vs[-1]:g}" if vs else "-", color="#73bf69",
                        fontsize=28, ha="center", va="center", transform=ax.transAxes)
                ax.text((i + 0.5) / n, 0.2, legend, color="#ccccdc", fontsize=8, ha="center",
                        transform=ax.transAxes)
            continue
        if not series:
            ax.text(0.5, 0.5, "No data", color="#8e8e8e", ha="center", va="center",
                    transform=ax.transAxes)
        right = None
        colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
        for legend, ts, vs in series[:12]:
            unit, placement = field_config(p, legend)
            scale, label = UNITS.get(unit, (1, unit))
            target = ax
            if placement == "right":
                if right is None:
                    right = ax.twinx()
                    right.tick_params(colors="#8e8e8e", labelsize=7)
                target = right
            target.plot(ts, [v * scale for v in vs], linewidth=1.2, label=legend[:60],
                        color=next(colors))
            target.set_ylabel(label, color="#8e8e8e", fontsize=7)
        ax.set_xlim(0, end - start)
        ax.set_xlabel("seconds into the run", color="#8e8e8e", fontsize=7)
        ax.grid(color="#2c3235", linewidth=0.5)
        if series:
            handles = [h for a in (ax, right) if a for h in a.get_legend_handles_labels()[0]]
            leg = ax.legend(handles=handles, fontsize=6, loc="upper left", frameon=False, ncol=2)
            for text in leg.get_texts():
                text.set_color("#ccccdc")
    fig.savefig(path, facecolor=fig.get_facecolor())
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cloud", default="openstack", choices=["ibm", "openstack", "gcp", "azure"])
    ap.add_argument("--minutes", type=float, default=4)
    ap.add_argument("--out", default=os.path.join(REPO, "docs/dashboard.png"))
    ap.add_argument("--demo", default=os.path.join(REPO, "ci/demo"), help="the demo script")
    args = ap.parse_args()
    dashboard = json.load(open(DASHBOARD))
    work = tempfile.mkdtemp(prefix="dashboard-")
    run = Run(args.cloud, work, args.demo)
    try:
        run.wait_ready()
        run.start_prometheus()
        start = work_the_cluster(run, args.minutes)
        end = time.time()
        scrapes = run.query(f"count_over_time(up{{job=\"{JOB}\"}}[{int(end - start) + 60}s])")
        families = run.query(f"count(count by (__name__) ({{job=\"{JOB}\"}}))")
        figures = render(run, dashboard, start, end, args.out, args.cloud)
        log(f"{scrapes[0]['value'][1] if scrapes else 0} scrapes, "
            f"{families[0]['value'][1] if families else 0} metric names scraped")
        for title, n in figures.items():
            log(f"  panel {title!r}: {n} series")
        log(f"wrote {args.out} ({os.path.getsize(args.out) // 1024} KiB)")
    finally:
        run.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
