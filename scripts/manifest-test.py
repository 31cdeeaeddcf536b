#!/usr/bin/env python3
"""Checks the Kubernetes manifests in deploy/kubernetes against what the
service really reads, so that they cannot drift from it.

Statically: every resource the kustomization lists exists and every manifest
is either listed or applied on its own (the migration Job, the PodMonitor);
selectors match the pods; every ORDER_TIMEOUT__* variable names a key of the
settings table (as `order-timeout config --defaults` prints it); every
secretKeyRef and the config volume point at a key that exists; the container
port is http.bind's port; the probes, the Service and the PodMonitor use that
port; terminationGracePeriodSeconds exceeds the drain (SHUTDOWN_LIMIT plus
CLOSE_LIMIT in src/app.rs) plus the preStop pause; both images are this
version's; the pods run as the image's user with a read-only root.

Then with the real binary: the Deployment's and the Job's environment (the
Secret's values, the pod's name) and the ConfigMap's TOML as the settings file
are accepted whole (`order-timeout config`, which refuses an unknown key or a
wrong value) and each variable is read; the Job's command migrates a fresh
PostgreSQL database; the Deployment's command, with migrations off, serves on
that schema with the manifest's bind, and its startup, liveness and readiness
probes, and /metrics for the PodMonitor, answer 200 on the container's port;
SIGTERM stops it cleanly within the grace period. The database and broker
vhost are made for the run and removed after it.

    .venv/bin/python scripts/manifest-test.py [--binary target/release/order-timeout]

Needs PyYAML, psql, the local RabbitMQ (AMQP 5672, management API 15672,
guest/guest) and PostgreSQL (127.0.0.1:5432, user postgres, trust).
"""

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from checks import Checks, Failed

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "deploy" / "kubernetes"
# Applied on their own, not by `kubectl apply -k` (README.md says when).
APPLIED_ALONE = {"migrate-job.yaml", "podmonitor.yaml"}
MGMT = "http://127.0.0.1:15672/api"
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
POD_NAME = "order-timeout-5d8f7c9b4-x2x7q"


def load_manifests():
    """Every document of every YAML file, by (kind, name), with its file."""
    found = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            key = (doc["kind"], doc.get("metadata", {}).get("name"))
            if key in found:
                raise Failed(f"{key} is defined twice")
            found[key] = (path.name, doc)
    return found


def cargo_version():
    text = (ROOT / "Cargo.toml").read_text()
    return tomllib.loads(text)["package"]["version"]


def drain_seconds():
    """SHUTDOWN_LIMIT + CLOSE_LIMIT: the longest a clean stop takes."""
    text = (ROOT / "src" / "app.rs").read_text()
    total = 0
    for name in ("SHUTDOWN_LIMIT", "CLOSE_LIMIT"):
        m = re.search(rf"pub const {name}: Duration = Duration::from_secs\((\d+)\);", text)
        if not m:
            raise Failed(f"src/app.rs has no `{name}` in whole seconds: update this test")
        total += int(m.group(1))
    return total


def image_uid():
    """The user scripts/image.sh builds the image with."""
    m = re.search(r"^uid=(\d+)$", (ROOT / "scripts" / "image.sh").read_text(), re.M)
    if not m:
        raise Failed("scripts/image.sh sets no uid=")
    return int(m.group(1))


def known_keys(binary):
    """The settings table's keys, from the reference file the binary prints
    (a key shipped commented out is a key too)."""
    text = run([binary, "config", "--defaults"], env={}).stdout
    keys, section = set(), None
    for line in text.splitlines():
        if m := re.match(r"^\[([a-z_]+)\]$", line):
            section = m.group(1)
        elif m := re.match(r"^(?:# )?([a-z_.]+) = ", line):
            keys.add(f"{section}.{m.group(1)}")
    if "http.bind" not in keys or "database.url" not in keys:
        raise Failed(f"could not read the keys from `config --defaults`: {sorted(keys)[:5]}")
    return keys


def env_key(name):
    """ORDER_TIMEOUT__HTTP__BIND is http.bind."""
    return name[len("ORDER_TIMEOUT__") :].lower().replace("__", ".")


def run(cmd, env, check=True, timeout=60):
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise Failed(f"{' '.join(map(str, cmd))} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def http(method, url, body=None, auth=None):
    req = urllib.request.Request(url, method=method, data=body)
    if auth:
        req.add_header("authorization", auth)
    if body is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def selector_matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def resolve_env(container, secret, checks, what):
    """The container's environment as the kubelet gives it."""
    values = {}
    data = dict(secret.get("stringData", {}))
    data.update({k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()})
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            values[name] = str(var["value"])
            continue
        source = var.get("valueFrom", {})
        if ref := source.get("secretKeyRef"):
            checks.ok(
                f"{what}: {name} from Secret {ref['name']} key {ref['key']}",
                ref["name"] == secret["metadata"]["name"] and ref["key"] in data,
                "no such Secret or key",
            )
            values[name] = data[ref["key"]]
        elif ref := source.get("fieldRef"):
            checks.eq(f"{what}: {name} from the pod's name", ref["fieldPath"], "metadata.name")
            values[name] = POD_NAME
        else:
            raise Failed(f"{what}: {name} has a source this test cannot resolve: {source}")
    return values


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "order-timeout"))
    args = parser.parse_args()
    binary = args.binary
    checks = Checks()
    cleanups = []
    try:
        test(binary, checks, cleanups)
    except Failed as e:
        print(f"manifest-test: FAILED: {e}", file=sys.stderr)
        print(f"manifest-test: {checks.passed} passed, 1 failed")
        return 1
    finally:
        for undo in reversed(cleanups):
            try:
                undo()
            except Exception as e:  # cleanup goes on whatever fails
                print(f"manifest-test: cleanup: {e}", file=sys.stderr)
    print(f"manifest-test: {checks.passed} passed, 0 failed")
    return 0


def test(binary, checks, cleanups):
    print("manifest-test: the manifests as written")
    found = load_manifests()
    by_kind = {}
    for (kind, name), (file, doc) in found.items():
        by_kind.setdefault(kind, []).append((name, file, doc))

    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    checks.ok("every resource of the kustomization exists", listed <= files, str(listed - files))
    checks.eq("every manifest is in the kustomization or applied alone", files - listed, APPLIED_ALONE)

    def one(kind):
        items = by_kind.get(kind, [])
        if len(items) != 1:
            raise Failed(f"expected one {kind}, found {len(items)}")
        return items[0][2]

    deployment, job = one("Deployment"), one("Job")
    configmap, secret = one("ConfigMap"), one("Secret")
    service, pdb, podmonitor = one("Service"), one("PodDisruptionBudget"), one("PodMonitor")
    pod = deployment["spec"]["template"]
    [server] = pod["spec"]["containers"]
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    labels = pod["metadata"]["labels"]

    checks.ok("Deployment: at least 2 replicas", deployment["spec"]["replicas"] >= 2)
    for what, selector in [
        ("Deployment", deployment["spec"]["selector"]["matchLabels"]),
        ("Service", service["spec"]["selector"]),
        ("PodDisruptionBudget", pdb["spec"]["selector"]["matchLabels"]),
        ("PodMonitor", podmonitor["spec"]["selector"]["matchLabels"]),
    ]:
        checks.ok(f"{what}'s selector matches the pods", selector_matches(selector, labels), str(selector))
    checks.ok(
        "the Job's pods are not the Service's",
        not selector_matches(service["spec"]["selector"], job["spec"]["template"]["metadata"]["labels"]),
    )

    version = cargo_version()
    checks.ok(
        f"Deployment's image is version {version}",
        server["image"].endswith(f"/order-timeout:{version}") or server["image"] == f"order-timeout:{version}",
        server["image"],
    )
    checks.eq("the Job runs the same image", migrate["image"], server["image"])

    binary_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    help_text = run([binary, "--help"], env=binary_env).stdout
    commands = set(re.findall(r"^  ([a-z]+) ", help_text.split("Commands:")[1], re.M))
    checks.eq("Deployment runs serve", server.get("args"), ["serve"])
    checks.ok(f"the Job's command `{' '.join(migrate['args'])}` is a subcommand", migrate["args"][0] in commands)
    checks.ok("no command overrides the image's entrypoint", "command" not in server and "command" not in migrate)

    keys = known_keys(binary)
    for what, container in [("Deployment", server), ("Job", migrate)]:
        for var in container.get("env", []):
            name = var["name"]
            if name.startswith("ORDER_TIMEOUT__"):
                checks.ok(f"{what}: {name} is the setting {env_key(name)}", env_key(name) in keys)
            else:
                checks.eq(f"{what}: {name} is read by the service", name, "ORDER_TIMEOUT_CONFIG")
    server_vars = {v["name"]: v for v in server["env"]}
    checks.eq(
        "Deployment: migrations off (the Job runs them)",
        server_vars.get("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", {}).get("value"),
        "false",
    )
    job_db = {v["name"]: v for v in migrate["env"]}["ORDER_TIMEOUT__DATABASE__URL"]["valueFrom"]["secretKeyRef"]["key"]
    server_db = server_vars["ORDER_TIMEOUT__DATABASE__URL"]["valueFrom"]["secretKeyRef"]["key"]
    checks.ok(f"the Job migrates as the schema owner ({job_db}), not as {server_db}", job_db != server_db)

    toml_text = None
    for what, spec, container in [
        ("Deployment", pod["spec"], server),
        ("Job", job["spec"]["template"]["spec"], migrate),
    ]:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        config_path = {v["name"]: v["value"] for v in container["env"] if "value" in v}.get("ORDER_TIMEOUT_CONFIG")
        mount = next(
            (m for m in container.get("volumeMounts", []) if config_path and config_path.startswith(m["mountPath"] + "/")),
            None,
        )
        checks.ok(f"{what}: ORDER_TIMEOUT_CONFIG ({config_path}) is in a mounted volume", mount is not None)
        volume = volumes[mount["name"]]
        file_key = config_path[len(mount["mountPath"]) + 1 :]
        checks.ok(
            f"{what}: that volume is the ConfigMap, and it has {file_key}",
            volume.get("configMap", {}).get("name") == configmap["metadata"]["name"] and file_key in configmap["data"],
        )
        toml_text = configmap["data"][file_key]

    settings = tomllib.loads(toml_text)
    flat = {}

    def flatten(prefix, table):
        for k, v in table.items():
            if isinstance(v, dict):
                flatten(f"{prefix}{k}.", v)
            else:
                flat[f"{prefix}{k}"] = v

    flatten("", settings)
    for key in flat:
        checks.ok(f"ConfigMap: {key} is a setting", key in keys)
    bind = server_vars.get("ORDER_TIMEOUT__HTTP__BIND", {}).get("value") or flat.get("http.bind")
    checks.ok("http.bind is set for the pods", bind is not None)
    bind_port = int(bind.rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    checks.eq("the container port `http` is http.bind's port", ports.get("http"), bind_port)
    checks.ok("http.bind listens beyond loopback", not bind.startswith("127.") and not bind.startswith("[::1]"))
    checks.eq("the Service targets `http`", [p["targetPort"] for p in service["spec"]["ports"]], ["http"])
    checks.eq("the PodMonitor scrapes `http` /metrics", [(e["port"], e["path"]) for e in podmonitor["spec"]["podMetricsEndpoints"]], [("http", "/metrics")])
    probes = {}
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = server.get(name)
        checks.ok(f"Deployment has a {name}", probe is not None and "httpGet" in probe)
        port = probe["httpGet"]["port"]
        checks.ok(f"{name} port {port} is the container's", port in ports or port in ports.values())
        probes[name] = (probe["httpGet"]["path"], ports.get(port, port))

    drain = drain_seconds()
    pre_stop = server.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    checks.ok(
        f"terminationGracePeriodSeconds {grace} > preStop {pre_stop} s + drain {drain} s",
        grace > pre_stop + drain,
    )

    uid = image_uid()
    for what, spec, container in [
        ("Deployment", pod["spec"], server),
        ("Job", job["spec"]["template"]["spec"], migrate),
    ]:
        pod_sc, sc = spec.get("securityContext", {}), container.get("securityContext", {})
        checks.ok(f"{what}: non-root, as the image's user {uid}", pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser") == uid)
        checks.ok(
            f"{what}: read-only root, no privilege escalation, no capabilities",
            sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop") == ["ALL"],
        )
    tmp = next((m for m in server.get("volumeMounts", []) if m["mountPath"] == "/tmp"), None)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    checks.ok("Deployment: /tmp is a writable emptyDir", tmp is not None and "emptyDir" in volumes[tmp["name"]])

    kubectl = shutil.which("kubectl")
    if kubectl:
        rendered = run([kubectl, "kustomize", str(MANIFESTS)], env=binary_env)
        kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d)
        checks.eq("kubectl kustomize renders the service", kinds, sorted(found[k][1]["kind"] for k in found if found[k][0] in listed))
    else:
        print("  --  kubectl not installed: the kustomization is not rendered")

    print("manifest-test: the real binary with the manifests' settings")
    work = Path(tempfile.mkdtemp(prefix="manifest-test-"))
    cleanups.append(lambda: shutil.rmtree(work, ignore_errors=True))
    config_file = work / "order-timeout.toml"
    config_file.write_text(toml_text)
    envs = {}
    for what, container in [("Deployment", server), ("Job", migrate)]:
        env = resolve_env(container, secret, checks, what)
        # The mount path exists in the pod, not here: the same file, elsewhere.
        env["ORDER_TIMEOUT_CONFIG"] = str(config_file)
        envs[what] = env
        shown = run([binary, "config"], env=env, check=False)
        checks.ok(f"{what}: its settings are accepted whole (order-timeout config)", shown.returncode == 0, shown.stderr.strip())
        for name in env:
            if name.startswith("ORDER_TIMEOUT__"):
                checks.ok(f"{what}: {name} is read", f"# from env {name}" in shown.stdout)
        for key in flat:
            if not any(env_key(n) == key for n in env if n.startswith("ORDER_TIMEOUT__")):
                checks.ok(f"{what}: {key} comes from the ConfigMap", re.search(rf"# from file {re.escape(str(config_file))}$", line_of(shown.stdout, key), re.M) is not None)

    run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
    database = f"ot_manifest_test_{run_id.replace('-', '_')}"
    vhost = f"ot-test-manifest-{run_id}"
    psql = ["psql", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"]
    run(psql + [f'CREATE DATABASE "{database}"'], env=binary_env)
    cleanups.append(lambda: run(psql + [f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'], env=binary_env))
    status, _ = http("PUT", f"{MGMT}/vhosts/{vhost}", b"{}", GUEST)
    if status not in (201, 204):
        raise Failed(f"cannot create vhost {vhost} through {MGMT}: {status}")
    cleanups.append(lambda: http("DELETE", f"{MGMT}/vhosts/{vhost}", None, GUEST))
    http("PUT", f"{MGMT}/permissions/{vhost}/guest", json.dumps({"configure": ".*", "write": ".*", "read": ".*"}).encode(), GUEST)
    db_url = f"postgres://postgres@127.0.0.1:5432/{database}"

    # The Job, its URL pointed at the test's database.
    job_env = dict(envs["Job"], ORDER_TIMEOUT__DATABASE__URL=db_url)
    migrated = run([binary, *migrate["args"]], env=job_env, check=False, timeout=120)
    checks.ok(f"the Job's `{' '.join(migrate['args'])}` migrates a fresh database", migrated.returncode == 0, migrated.stderr.strip()[-1000:])
    status_lines = run([binary, "migrate", "status"], env=job_env).stdout.splitlines()
    checks.ok(
        "every migration applied, none pending (migrate status)",
        any(line.startswith("applied ") for line in status_lines)
        and not any(line.startswith("pending ") for line in status_lines),
        "\n".join(status_lines[-5:]),
    )

    # The Deployment's pod: its bind and port, unless another process here has
    # that port (then the same address on a free one).
    port = bind_port if port_free(bind_port) else free_port()
    if port != bind_port:
        print(f"  --  port {bind_port} is in use on this machine: the pod's probes go to port {port}")
    server_env = dict(
        envs["Deployment"],
        ORDER_TIMEOUT__DATABASE__URL=db_url,
        ORDER_TIMEOUT__AMQP__URL=f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
        ORDER_TIMEOUT__HTTP__BIND=bind.rsplit(":", 1)[0] + f":{port}",
    )
    log = open(work / "serve.log", "w")
    proc = subprocess.Popen([binary, *server["args"]], env=server_env, stdout=log, stderr=subprocess.STDOUT)

    def stop():
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    cleanups.append(stop)
    base = f"http://127.0.0.1:{port}"
    startup_path, _ = probes["startupProbe"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failed(f"serve exited {proc.returncode}: {(work / 'serve.log').read_text()[-2000:]}")
        try:
            if http("GET", base + startup_path)[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    for name, (path, probe_port) in probes.items():
        checks.eq(f"{name} GET {path} on port {probe_port}", probe_port, bind_port)
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            status, body = http("GET", base + path)
            # 503 is "not yet"; anything else is the answer.
            if status != 503:
                break
            time.sleep(0.2)
        checks.eq(f"{name} {path} answers 200", status, 200)
    status, body = http("GET", base + "/metrics")
    checks.ok("GET /metrics answers 200 with the service's metrics", status == 200 and "order_timeout_" in body)

    grace_s = pod["spec"]["terminationGracePeriodSeconds"]
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        raise Failed(f"serve did not stop within terminationGracePeriodSeconds ({grace_s} s)")
    took = time.monotonic() - started
    checks.eq("SIGTERM: exit status 0", code, 0)
    checks.ok(f"stopped in {took:.1f} s, within the grace period ({grace_s} s)", took < grace_s)
    log.close()
    text = (work / "serve.log").read_text()
    checks.ok("the log says it stopped, nothing abandoned", "stopped" in text and "shutdown limit reached" not in text)


def line_of(text, key):
    """The line `order-timeout config` prints for a dotted key."""
    section, name = key.split(".", 1)
    current = None
    for line in text.splitlines():
        if m := re.match(r"^\[([a-z_]+)\]$", line):
            current = m.group(1)
        elif current == section and line.startswith(f"{name} = "):
            return line
    return ""


if __name__ == "__main__":
    sys.exit(main())
