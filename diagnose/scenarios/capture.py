"""Captures real Envoy failure scenarios as test fixtures.

For each scenario folder (edge.yaml, service.yaml, scenario.json) it renders the
templates with free ports and fresh certificates, starts the sample upstream and both
Envoys, drives the scenario's request through the edge (with debug level around it
when asked), then saves the response, both sidecars' /clusters?format=json, trimmed
/config_dump, ssl and secrets stats, their logs (access log and Envoy's own log mixed,
as a container runtime shows them) and the debug window.
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
import urllib.error
import urllib.request

SIDECARS = ("edge", "service")
STATS_FILTER = "ssl|secrets"
# Lines kept from before the request in the saved log.
TAIL_BEFORE = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(d):
    """A mesh CA with edge and service certificates, and a rogue CA with an edge
    certificate the mesh does not trust."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "rogue-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN={ca}", "-keyout", f"{ca}-key.pem", "-out", f"{ca}.pem")
    for name, ca, san in (("edge", "ca", "edge.mesh.local"),
                          ("service", "ca", "catalog.mesh.local"),
                          ("rogue-edge", "rogue-ca", "edge.mesh.local")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={san}",
            "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName=DNS:{san}\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")


def render(template, values):
    text = open(template).read()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    left = re.findall(r"\{\{[A-Z_]+\}\}", text)
    if left:
        raise SystemExit(f"{template}: unknown placeholders {sorted(set(left))}")
    return text


def http(method, url, timeout=10):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def wait_until(what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def read_from(path, offset):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def trim_config_dump(text):
    """Keeps the route and cluster configurations: what diagnosis reads."""
    dump = json.loads(text)
    keep = (".RoutesConfigDump", ".ClustersConfigDump")
    dump["configs"] = [c for c in dump.get("configs", []) if c.get("@type", "").endswith(keep)]
    return json.dumps(dump, indent=1) + "\n"


def capture(envoy, scenario_dir, out_dir):
    name = os.path.basename(scenario_dir.rstrip("/"))
    spec = json.load(open(os.path.join(scenario_dir, "scenario.json")))
    work = tempfile.mkdtemp(prefix=f"meshcat-{name}-")
    procs = []
    base_ids = []
    try:
        certs = os.path.join(work, "certs")
        os.mkdir(certs)
        make_certs(certs)
        ports = {k: free_port() for k in (
            "EDGE_PORT", "EDGE_ADMIN_PORT", "SERVICE_PORT", "SERVICE_ADMIN_PORT",
            "UPSTREAM_PORT", "DEAD_PORT")}
        values = dict(ports, CERT_DIR=certs)
        upstream_mode = spec.get("upstream", "running")
        upstream = None
        if upstream_mode != "none":
            upstream = subprocess.Popen(
                [sys.executable, os.path.join(os.path.dirname(__file__), "upstream.py"),
                 str(ports["UPSTREAM_PORT"])], start_new_session=True)
            procs.append(upstream)
        logs, admins = {}, {}
        for i, side in enumerate(SIDECARS):
            cfg = os.path.join(work, f"{side}.yaml")
            with open(cfg, "w") as f:
                f.write(render(os.path.join(scenario_dir, f"{side}.yaml"), values))
            logs[side] = os.path.join(work, f"{side}.log")
            admins[side] = f"http://127.0.0.1:{ports[side.upper() + '_ADMIN_PORT']}"
            log = open(logs[side], "wb")
            # A session of its own: Envoy's parent-death signal must not reach it when
            # an intermediate process ends, and stopping it must not touch us.
            base_ids.append(ports[side.upper() + "_ADMIN_PORT"])
            procs.append(subprocess.Popen(
                [envoy, "-c", cfg, "--base-id", str(base_ids[-1]),
                 "--file-flush-interval-msec", "200", "-l", "info",
                 "--service-cluster", side, "--service-node", f"{side}-0"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        for side in SIDECARS:
            wait_until(f"{side} ready", lambda: http("GET", admins[side] + "/ready", 1)[0] == 200, 30)
        if upstream is not None:
            wait_until("upstream", lambda: socket.create_connection(
                ("127.0.0.1", ports["UPSTREAM_PORT"]), 1).close() or True, 10)
        edge = f"http://127.0.0.1:{ports['EDGE_PORT']}"
        path = spec["path"]
        if upstream_mode == "stopped_after_warmup":
            code, _ = http("GET", edge + path)
            if code != 200:
                raise SystemExit(f"{name}: warm-up request answered {code}")
            upstream.send_signal(signal.SIGTERM)
            upstream.wait(10)
        offsets = {side: os.path.getsize(logs[side]) for side in SIDECARS}
        if spec.get("debug"):
            for side in SIDECARS:
                http("POST", admins[side] + "/logging?level=debug")
        code, body = http("GET", edge + path)
        want = spec.get("expect_code")
        if want is not None and code != want:
            raise SystemExit(f"{name}: expected {want}, got {code}: {body!r}")
        # The access line is written when the request ends; wait for it to be flushed.
        wait_until("edge access line", lambda: f'"GET {path} ' in read_from(logs["edge"], offsets["edge"]), 10)
        wait_for = spec.get("wait_for")
        if wait_for:
            pattern = re.compile(wait_for["pattern"])
            wait_until(wait_for["pattern"], lambda: pattern.search(
                read_from(logs[wait_for["log"]], offsets[wait_for["log"]])), wait_for.get("timeout", 60))
        if spec.get("debug"):
            for side in SIDECARS:
                http("POST", admins[side] + "/logging?level=info")
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "response.json"), "w") as f:
            json.dump({"path": path, "code": code, "body": body}, f, indent=1)
            f.write("\n")
        for side in SIDECARS:
            base = admins[side]
            _, clusters = http("GET", base + "/clusters?format=json")
            _, dump = http("GET", base + "/config_dump")
            _, stats = http("GET", base + "/stats?format=json&filter=" + urllib.parse.quote(STATS_FILTER))
            with open(os.path.join(out_dir, f"{side}.clusters.json"), "w") as f:
                f.write(clusters)
            with open(os.path.join(out_dir, f"{side}.config_dump.json"), "w") as f:
                f.write(trim_config_dump(dump))
            with open(os.path.join(out_dir, f"{side}.stats.json"), "w") as f:
                f.write(stats)
        time.sleep(0.5)  # one more flush interval so the last lines reach the files
        for side in SIDECARS:
            window = read_from(logs[side], offsets[side])
            if spec.get("debug"):
                with open(os.path.join(out_dir, f"{side}.debug.log"), "w") as f:
                    f.write(window)
            # What a tail of the sidecar's log shows: the lines just before the
            # request (start-up lines trimmed) and everything since.
            with open(logs[side], "rb") as f:
                before = f.read(offsets[side]).decode("utf-8", "replace").splitlines(True)
            with open(os.path.join(out_dir, f"{side}.log"), "w") as f:
                f.write("".join(before[-TAIL_BEFORE:]) + window)
        print(f"{name}: {code} {body[:100]!r}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # A stopped Envoy leaves its hot restart region (base id * 10) in /dev/shm.
        for base_id in base_ids:
            try:
                os.remove(f"/dev/shm/envoy_shared_memory_{base_id * 10}")
            except FileNotFoundError:
                pass
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--envoy", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    names = args.names or sorted(
        d for d in os.listdir(args.scenarios)
        if os.path.isfile(os.path.join(args.scenarios, d, "scenario.json")))
    for name in names:
        capture(args.envoy, os.path.join(args.scenarios, name), os.path.join(args.out, name))


if __name__ == "__main__":
    main()
