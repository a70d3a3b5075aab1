"""Builds the repository's Dockerfile with podman, runs the image and queries it.

Where Docker Hub is out of reach the base image is made here: a Debian bookworm root
filesystem with python3 and its venv module (mmdebstrap, minbase variant), imported
with `podman import` and handed to the Dockerfile as BASE_IMAGE. pip inside the build
uses this machine's pip configuration (index, extra index, find-links) through the
build secret `pipconf`, with local index directories mounted read-only; elsewhere pip
falls back to PyPI. Then the container runs with a read-only model repository and the
host's IPC namespace, and the checks below go through tritonclient from the host:

  health ready, HTTP inference, gRPC inference, ONNX inference (onnxruntime in the
  image), a system shared-memory inference through the shared /dev/shm, metrics, the
  image's HEALTHCHECK, every server process non-root, /models read-only.

Prints a transcript (build time, image size, each check) and writes it under --work.
Needs root (rootful podman), podman, and mmdebstrap unless --base-image is given.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_UID = 10001  # the Dockerfile's `useradd --uid`
LINES: list[str] = []
PIP_OPTIONS = ("index-url", "extra-index-url", "find-links", "cert")
CA_IN_BUILD = "/tmp/pip-build-ca.crt"


def say(line: str) -> None:
    print(line, flush=True)
    LINES.append(line)


def run(cmd, check=True, timeout=1800, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode:
        raise SystemExit(f"failed: {' '.join(map(str, cmd))}\n{done.stdout}{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime_options(base: str) -> list[str]:
    """podman's defaults fail on some hosts: crun refuses cgroup v1/v2 hybrid mounts,
    and raising RLIMIT_NOFILE/NPROC to podman's defaults needs CAP_SYS_RESOURCE (both
    seen in this project's sandbox). Try the defaults, then runc with limits below the
    host's hard limits; the first that starts a container is used for build and run."""
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = min(65536, hard_nofile if hard_nofile > 0 else 65536)
    candidates = [[], ["--runtime", "runc", "--ulimit", f"nofile={nofile}:{nofile}",
                       "--ulimit", "nproc=8192:8192"]]
    why = []
    for opts in candidates:
        # no network: this asks about the runtime; bridge_network() asks about the rest
        done = run(["podman", "run", "--rm", "--network", "none", *opts, base, "true"],
                   check=False, timeout=300)
        if done.returncode == 0:
            return opts
        why.append(f"{' '.join(opts) or '(defaults)'}: {done.stderr.strip()[-400:]}")
    raise SystemExit("podman cannot start a container here with either runtime\n"
                     + "\n".join(why))


def bridge_network(base: str, rt: list[str]) -> str | None:
    """None where podman's default bridge network works here, else why not. netavark
    sets the bridge up with iptables or nftables, and a host without either (seen in
    this project's CI) fails every container that publishes a port."""
    done = run(["podman", "run", "--rm", *rt, base, "true"], check=False, timeout=300)
    return None if done.returncode == 0 else done.stderr.strip()[-400:]


def base_image(args) -> str:
    """BASE_IMAGE for the build: --base-image, or a Debian root filesystem built with
    mmdebstrap (cached as a tar under --work) and imported as an image."""
    if args.base_image:
        return args.base_image
    name = "localhost/shmserve-base:bookworm"
    if not args.rebuild_base and run(["podman", "image", "exists", name],
                                     check=False).returncode == 0:
        say(f"base image: {name} (present)")
        return name
    tar = args.work / "base-bookworm.tar"
    if args.rebuild_base or not tar.exists():
        t0 = time.monotonic()
        # docs, man pages and locales are no use in a server image
        run(["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,"
             "ca-certificates", "--dpkgopt=path-exclude=/usr/share/doc/*",
             "--dpkgopt=path-exclude=/usr/share/man/*",
             "--dpkgopt=path-exclude=/usr/share/locale/*", "bookworm", str(tar)])
        say(f"base rootfs: mmdebstrap bookworm minbase + python3, python3-venv in "
            f"{time.monotonic() - t0:.0f} s ({tar.stat().st_size >> 20} MiB tar)")
    run(["podman", "import", "--change", 'CMD ["/bin/bash"]', str(tar), name])
    say(f"base image: {name} (imported)")
    return name


def pip_config(work: Path) -> tuple[Path | None, list[str]]:
    """This machine's effective pip index settings as a pip.conf for the build secret,
    and `-v dir:dir:ro` mounts for the local directories they name. A `cert` (a proxy's
    CA bundle, as here) is mounted at CA_IN_BUILD for the install step only."""
    listed = run([sys.executable, "-m", "pip", "config", "list"], check=False).stdout
    conf: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if option in PIP_OPTIONS:
            conf[option] = value.strip().strip("'\"")
    for option in PIP_OPTIONS:
        env = os.environ.get("PIP_" + option.upper().replace("-", "_"))
        if env:
            conf[option] = env
    if not conf:
        return None, []
    mounts = []
    if "cert" in conf:
        mounts += ["-v", f"{conf['cert']}:{CA_IN_BUILD}:ro"]
        conf["cert"] = CA_IN_BUILD
    for value in (v for k, v in conf.items() if k != "cert"):
        for item in value.split():
            path = item.removeprefix("file://")
            if path.startswith("/"):
                top = Path(path)
                while top.name in ("simple",) or not top.exists():
                    top = top.parent
                mounts += ["-v", f"{top}:{top}:ro"]
    path = work / "pip.conf"
    path.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
    return path, mounts


def build(args, base: str, rt: list[str]) -> float:
    conf, mounts = pip_config(args.work)
    # docker format: OCI image configs have no HEALTHCHECK
    cmd = ["podman", "build", *rt, "--format", "docker", "--network", "host", "-f", str(ROOT / "Dockerfile"),
           "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"EXTRAS={args.extras}",
           "-t", args.image, *mounts]
    if conf:
        cmd += ["--secret", f"id=pipconf,src={conf}"]
        say(f"pip in the build: {conf} as secret pipconf, mounts {mounts[1::2] or 'none'}")
    t0 = time.monotonic()
    done = run(cmd + [str(ROOT)], check=False, timeout=3600)
    (args.work / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"build failed; log in {args.work / 'build.log'}:\n"
                         + (done.stdout + done.stderr)[-4000:])
    return time.monotonic() - t0


def model_repository(work: Path) -> Path:
    """The README's example models (python backend) and, where the `onnx` package is at
    hand, a tiny ONNX identity (tests/onnx_models.py), readable by the image's user."""
    repo = work / "models"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "examples" / "model_repository", repo)
    try:
        sys.path.insert(0, str(ROOT))
        from tests import onnx_models
        onnx_models.identity(repo / "identity_onnx", config=(
            'name: "identity_onnx"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'))
    except ImportError:
        say("onnx not installed here: no ONNX model in the check")
    for dirpath, dirnames, filenames in os.walk(repo):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return repo


class Checks:
    """The probes against the running container; each records one transcript line."""

    def __init__(self, name: str, ports: dict[str, int]):
        self.name, self.ports, self.failed = name, ports, []

    def check(self, what: str, fn) -> None:
        t0 = time.monotonic()
        try:
            detail = fn()
            say(f"  ok    {what}: {detail} ({(time.monotonic() - t0) * 1e3:.0f} ms)")
        except Exception as exc:  # a failed check is reported, the others still run
            self.failed.append(what)
            say(f"  FAIL  {what}: {type(exc).__name__}: {exc}")

    def exec(self, *cmd: str) -> subprocess.CompletedProcess:
        return run(["podman", "exec", self.name, *cmd], check=False, timeout=60)

    def running(self) -> bool:
        out = run(["podman", "inspect", "--format", "{{.State.Running}}", self.name],
                  check=False).stdout.strip()
        return out == "true"

    def wait_ready(self, timeout: float) -> float:
        import urllib.request
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{self.ports['http']}/v2/health/ready"
        while time.monotonic() - t0 < timeout:
            if not self.running():
                raise RuntimeError("the container exited")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.5)  # a poll with a deadline, not a synchronisation
        raise TimeoutError(f"not ready after {timeout:.0f} s")


def infer_checks(c: Checks, onnx: bool) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    http = httpclient.InferenceServerClient(f"127.0.0.1:{c.ports['http']}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{c.ports['grpc']}")
    x = np.arange(16, dtype=np.float32).reshape(1, 16)

    def over_http():
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = http.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
        assert np.array_equal(out, x), out
        return "identity_fp32 [1,16] FP32 echoed"

    def over_grpc():
        a, b = x[0], np.full(16, 2, np.float32)
        inputs = [grpcclient.InferInput(n, [16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        res = grpc.infer("add_sub", inputs)
        assert np.array_equal(res.as_numpy("OUTPUT0"), a + b)
        assert np.array_equal(res.as_numpy("OUTPUT1"), a - b)
        return "add_sub sum and difference right"

    def over_onnx():
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = grpc.infer("identity_onnx", [inp]).as_numpy("OUTPUT0")
        assert np.array_equal(out, x), out
        return "identity_onnx through onnxruntime in the image"

    def over_system_shm():
        # keys under /shmserve- name the server's own segments and are refused
        key, size = f"/container-check-{os.getpid()}", x.nbytes
        handles = []
        try:
            for suffix in ("in", "out"):
                h = shm.create_shared_memory_region(f"check_{suffix}", key + suffix, size)
                handles.append(h)
                # tritonclient creates regions 0600: the server runs as uid 10001, so
                # the region must belong to it (a client running as that user needs
                # nothing; this one is root)
                os.chown("/dev/shm" + key + suffix, IMAGE_UID, -1)
            shm.set_shared_memory_region(handles[0], [x])
            http.register_system_shared_memory("check_in", key + "in", size)
            http.register_system_shared_memory("check_out", key + "out", size)
            inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_shared_memory("check_in", size)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            out.set_shared_memory("check_out", size)
            http.infer("identity_fp32", [inp], outputs=[out])
            got = shm.get_contents_as_numpy(handles[1], np.float32, list(x.shape))
            assert np.array_equal(got, x), got
            return "input and output regions in the host's /dev/shm"
        finally:
            for name in ("check_in", "check_out"):
                try:
                    http.unregister_system_shared_memory(name)
                except Exception:
                    pass
            for h in handles:
                shm.destroy_shared_memory_region(h)

    def metrics():
        import urllib.request
        url = f"http://127.0.0.1:{c.ports['metrics']}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        line = next(ln for ln in text.splitlines()
                    if ln.startswith("nv_inference_request_success{")
                    and 'model="identity_fp32"' in ln)
        assert float(line.split()[-1]) >= 1, line
        return line

    c.check("HTTP inference", over_http)
    c.check("gRPC inference", over_grpc)
    if onnx:
        c.check("ONNX model over gRPC", over_onnx)
    c.check("system shm inference (--ipc=host)", over_system_shm)
    c.check("metrics", metrics)


def container_checks(c: Checks) -> None:
    def non_root():
        # every process in the container, read from /proc (minbase has no ps)
        out = c.exec("python3", "-c", (
            "import os\nfor p in os.listdir('/proc'):\n if p.isdigit():\n"
            "  try:\n   s=open(f'/proc/{p}/status').read()\n  except OSError:\n"
            "   continue\n  u=[l for l in s.splitlines() if l.startswith('Uid:')][0]\n"
            "  print(p, u.split()[1])")).stdout
        uids = {int(line.split()[1]) for line in out.splitlines()}
        assert uids == {IMAGE_UID}, out
        return f"{len(out.splitlines())} processes, all uid {IMAGE_UID}"

    def read_only():
        done = c.exec("sh", "-c", "touch /models/identity_fp32/written")
        assert done.returncode != 0 and "Read-only" in done.stderr, done
        return done.stderr.strip().split(": ", 1)[-1]

    def read_only_root():
        done = c.exec("sh", "-c", "touch /home/shmserve/written")
        assert done.returncode != 0 and "Read-only" in done.stderr, done
        return "the server runs with only /tmp, ~/.cache and /dev/shm writable"

    def healthcheck():
        done = run(["podman", "healthcheck", "run", c.name], check=False, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return "the image's HEALTHCHECK passes"

    c.check("non-root", non_root)
    c.check("model repository read-only", read_only)
    c.check("root filesystem read-only", read_only_root)
    c.check("HEALTHCHECK", healthcheck)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/shmserve-container-check"))
    p.add_argument("--base-image", help="skip mmdebstrap and build on this image")
    p.add_argument("--rebuild-base", action="store_true")
    p.add_argument("--image", default="localhost/shmserve:check")
    p.add_argument("--extras", default="cpu")
    p.add_argument("--network", choices=("publish", "host"), default="publish",
                   help="publish the ports on 127.0.0.1, or share the host's network")
    p.add_argument("--ready-timeout", type=float, default=300)
    p.add_argument("--keep", action="store_true", help="leave the image in place")
    args = p.parse_args(argv)
    if shutil.which("podman") is None:
        raise SystemExit("podman not found (apt-get install podman)")
    args.work.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    say(f"container check of {ROOT} ({time.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    say(run(["podman", "--version"]).stdout.strip())
    base = base_image(args)
    rt = runtime_options(base)
    say(f"runtime options: {' '.join(rt) or '(podman defaults)'}")
    if args.network == "publish":
        why = bridge_network(base, rt)
        if why is not None:
            # the image is what is checked; the host's network stack is not
            say(f"bridge network unavailable ({why}); the container shares the "
                "host's network instead of publishing ports")
            args.network = "host"
    seconds = build(args, base, rt)
    size = int(run(["podman", "image", "inspect", "--format", "{{.Size}}",
                    args.image]).stdout.strip())
    say(f"build: {seconds:.0f} s, image {args.image} {size / 1e6:.0f} MB")
    repo = model_repository(args.work)
    onnx = (repo / "identity_onnx").exists()

    name = f"shmserve-check-{os.getpid()}"
    # as deploy/deployment.yaml runs it: read-only root (podman mounts tmpfs on /tmp),
    # a writable cache, no capabilities, no privilege escalation
    cmd = ["podman", "run", "-d", "--name", name, *rt, "--ipc=host",
           "-v", f"{repo}:/models:ro", "--read-only",
           "--tmpfs", "/home/shmserve/.cache:rw,mode=1777", "--cap-drop=ALL",
           "--security-opt", "no-new-privileges"]
    if args.network == "host":
        ports = {k: free_port() for k in ("http", "grpc", "metrics")}
        cmd += ["--network", "host"]
        server = ["--model-repository=/models", f"--http-port={ports['http']}",
                  f"--grpc-port={ports['grpc']}", f"--metrics-port={ports['metrics']}"]
    else:
        ports = {k: free_port() for k in ("http", "grpc", "metrics")}
        for k, inner in zip(ports, (8000, 8001, 8002)):
            cmd += ["-p", f"127.0.0.1:{ports[k]}:{inner}"]
        server = ["--model-repository=/models", "--http-port=8000", "--grpc-port=8001",
                  "--metrics-port=8002"]
    # client shm is off by default (a network-facing server); this check turns it on
    run(cmd + [args.image, *server, "--allow-client-shm=true"])
    c = Checks(name, ports)
    try:
        say(f"run: {' '.join(cmd[2:])} {args.image} ... (ports {ports})")
        c.check("health ready", lambda: f"ready {c.wait_ready(args.ready_timeout):.1f} s "
                "after start")
        if not c.failed:
            infer_checks(c, onnx)
            container_checks(c)
        state = json.loads(run(["podman", "inspect", name]).stdout)[0]
        ro = [m for m in state["Mounts"] if m["Destination"] == "/models"]
        say(f"mount /models: RW={ro[0]['RW']}")
    finally:
        logs = run(["podman", "logs", name], check=False)
        (args.work / "server.log").write_text(logs.stdout + logs.stderr)
        t0 = time.monotonic()
        run(["podman", "stop", "-t", "40", name], check=False, timeout=120)
        code = run(["podman", "inspect", "--format", "{{.State.ExitCode}}", name],
                   check=False).stdout.strip()
        say(f"stop: SIGTERM, exited {code} in {time.monotonic() - t0:.1f} s")
        run(["podman", "rm", "-f", name], check=False)
        if not args.keep:
            run(["podman", "rmi", args.image], check=False)
    say(f"{'FAILED: ' + ', '.join(c.failed) if c.failed else 'all checks passed'} "
        f"({time.monotonic() - t_all:.0f} s in all; server log {args.work}/server.log)")
    (args.work / "transcript.txt").write_text("\n".join(LINES) + "\n")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
