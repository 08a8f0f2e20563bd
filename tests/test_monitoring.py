"""The alert rules and the Grafana dashboard in packaging/monitoring,
checked against the exporter itself:

- `promtool check rules` passes on graphd-alerts.yml, and its unit tests
  (tests/monitoring/graphd-alerts.test.yml, `promtool test rules`) pass:
  each alert fires on its series and stays quiet beside them;
- every query of the dashboard is PromQL that promtool accepts (Grafana's
  variables filled in), and the dashboard is sound (panel ids, grid);
- every metric a rule or a dashboard query names is one the real exporter
  emits: a host-backend graphd is started with --metrics-listen, a client
  process kept connected, and its /metrics scraped (Prometheus's own `up`
  aside).

promtool comes from Debian's prometheus package (scripts/deps.sh): without
it the test fails, saying so. Run by ctest with GRAPHD_BIN and GRAPHCTL_BIN
set; the standard library only."""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MON = os.path.join(ROOT, "packaging", "monitoring")
RULES = os.path.join(MON, "graphd-alerts.yml")
DASHBOARD = os.path.join(MON, "graphd-dashboard.json")
RULE_TESTS = os.path.join(ROOT, "tests", "monitoring", "graphd-alerts.test.yml")

# Names that Prometheus itself gives every target.
PROMETHEUS_OWN = {"up"}
# The alerts an operator of graphd needs, at least.
ALERTS = {"GraphdDown", "GraphdDeviceFailed", "GraphdMPSOff", "GraphdReplayErrors",
          "GraphdWorkerSaturated", "GraphdStagingBudgetNearlyFull", "GraphdFiguresStale"}

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
            "bool", "offset", "inf", "nan"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def promtool(*args):
    exe = shutil.which("promtool")
    if not exe:
        raise AssertionError("promtool is not installed: install Debian's prometheus package "
                             "(apt-get install prometheus; scripts/deps.sh installs it)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def metric_names(expr):
    """The metric names a PromQL expression selects: words that are not
    functions, keywords, label names, label values, durations or numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        if not m.group(2) and m.group(1).lower() not in KEYWORDS:
            names.add(m.group(1))
    return names


def grafana_to_promql(expr):
    """A dashboard query with Grafana's variables filled in, as Prometheus
    would get it."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    expr = expr.replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def rule_exprs(path):
    """(alert name, expr) of each rule of a rules file, read without a YAML
    library: an `expr:` inline or as a block (| or >) of deeper lines."""
    lines = read(path).splitlines()
    out, name, i = [], None, 0
    while i < len(lines):
        m = re.match(r"\s*- (alert|record):\s*(\S+)", lines[i])
        if m:
            name = m.group(2)
        m = re.match(r"(\s*)expr:\s*(.*)$", lines[i])
        if m:
            indent, value = len(m.group(1)), m.group(2).strip()
            if value in ("|", "|-", ">", ">-"):
                block = []
                while i + 1 < len(lines) and (not lines[i + 1].strip() or
                                              len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                    i += 1
                    block.append(lines[i].strip())
                value = " ".join(block)
            elif value[:1] in "'\"":
                value = value[1:-1]
            out.append((name, value))
        i += 1
    return out


def dashboard_queries(dash):
    """Every PromQL query of a dashboard: the panels' targets' (rows' nested
    panels too) and the query variables' (label_values(METRIC, label))."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
        assert m, f"variable {v['name']}: not label_values(METRIC, LABEL): {q}"
        out.append((f"variable {v['name']}", m.group(1)))
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class MonitoringTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        """The names a real graphd's /metrics emits, with a client connected."""
        cls.dir = tempfile.mkdtemp(prefix="graphd-monitoring-")
        sock = os.path.join(cls.dir, "graphd.sock")
        port = free_port()
        log = open(os.path.join(cls.dir, "graphd.log"), "w")
        daemon = subprocess.Popen([os.environ["GRAPHD_BIN"], "--host-devices", "2", "--socket", sock,
                                   "--metrics-listen", f"127.0.0.1:{port}", "--device-budget", "64M"],
                                  stdout=log, stderr=subprocess.STDOUT)
        client = None
        try:
            text = None
            for _ in range(200):
                try:
                    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                    break
                except OSError:
                    time.sleep(0.05)
            assert text is not None, "no /metrics from graphd"
            # A client process with a session open (graphctl top, waiting),
            # so that the per-client families have samples.
            client = subprocess.Popen([os.environ["GRAPHCTL_BIN"], "--socket", sock, "top", "--interval", "60",
                                       "--count", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(200):
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                if "\ngraphd_client_sessions{" in text:
                    break
                time.sleep(0.05)
            cls.metrics = text
        finally:
            if client:
                client.terminate()
                client.wait(30)
            daemon.terminate()
            daemon.wait(30)
            log.close()
        cls.emitted = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", l).group(0)
                       for l in cls.metrics.splitlines() if l and not l.startswith("#")}

    def check_names(self, where, exprs):
        unknown = []
        for what, expr in exprs:
            names = metric_names(expr)
            self.assertTrue(names, f"{where}: {what}: no metric in {expr!r}")
            unknown += [f"{what}: {n}" for n in sorted(names - self.emitted - PROMETHEUS_OWN)]
        self.assertEqual(unknown, [], f"{where} names metrics graphd does not emit")

    def test_a_exporter_emits_what_alerting_needs(self):
        self.assertIn("\ngraphd_client_sessions{", self.metrics)  # the client was seen
        for name in ("graphd_build_info", "graphd_device_up", "graphd_device_state",
                     "graphd_device_mps_enabled", "graphd_device_memory_free_bytes",
                     "graphd_device_memory_total_bytes", "graphd_staging_budget_bytes",
                     "graphd_replay_latency_seconds_bucket", "graphd_replay_latency_seconds_sum",
                     "graphd_replay_latency_seconds_count", "graphd_device_figures_age_seconds",
                     "graphd_replay_worker_seconds_sum", "graphd_worker_busy_seconds_total",
                     "graphd_errors_total"):
            self.assertIn(name, self.emitted)

    def test_the_name_check_catches_a_wrong_name(self):
        self.assertEqual(metric_names('sum by (instance, le) (rate(graphd_bogus_total{device=~"$device"}[$__rate_interval])) '
                                      '/ on (instance) group_left (version) graphd_build_info > bool 1e-3 offset 5m'),
                         {"graphd_bogus_total", "graphd_build_info"})
        self.assertEqual(metric_names('histogram_quantile(0.99, sum without (uuid) (rate(x_bucket[5m]))) or vector(0)'),
                         {"x_bucket"})
        with self.assertRaises(AssertionError):
            self.check_names("a query", [("bogus", "rate(graphd_bogus_total[5m])")])

    def test_rules_pass_promtool(self):
        r = promtool("check", "rules", RULES)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        n = int(re.search(r"SUCCESS: (\d+) rules found", r.stdout).group(1))
        exprs = rule_exprs(RULES)
        self.assertEqual(len(exprs), n, "the rules read here are not those promtool found")
        self.assertLessEqual(ALERTS, {a for a, _ in exprs})
        r = promtool("test", "rules", RULE_TESTS)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_rules_name_emitted_metrics(self):
        self.check_names("graphd-alerts.yml", rule_exprs(RULES))

    def test_dashboard_queries_name_emitted_metrics(self):
        dash = json.loads(read(DASHBOARD))
        queries = dashboard_queries(dash)
        self.assertGreater(len(queries), 20)
        self.check_names("graphd-dashboard.json", [(w, grafana_to_promql(q)) for w, q in queries])

    def test_dashboard_queries_are_promql(self):
        dash = json.loads(read(DASHBOARD))
        path = os.path.join(self.dir, "dashboard-queries.yml")
        with open(path, "w", encoding="utf-8") as f:
            f.write("groups:\n  - name: dashboard\n    rules:\n")
            for k, (_, q) in enumerate(dashboard_queries(dash)):
                f.write(f"      - record: graphd:dashboard_query:{k}\n        expr: {json.dumps(grafana_to_promql(q))}\n")
        r = promtool("check", "rules", path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_dashboard_is_sound(self):
        dash = json.loads(read(DASHBOARD))
        self.assertTrue(dash["uid"] and dash["title"])
        ids = []
        for p in dash["panels"]:
            ids.append(p["id"])
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            for t in p.get("targets", []):
                # Every query goes to the dashboard's Prometheus variable.
                self.assertEqual(t["datasource"], {"type": "prometheus", "uid": "${datasource}"}, p["title"])
        self.assertEqual(len(ids), len(set(ids)), "panel ids repeat")
        names = [v["name"] for v in dash["templating"]["list"]]
        self.assertEqual(names[0], "datasource")


if __name__ == "__main__":
    unittest.main()
