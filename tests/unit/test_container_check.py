"""scripts/container_check.py's pieces that need no podman: how this machine's pip
configuration reaches the image build. The script itself builds and runs the image
(minutes, root and podman): run it by hand or from CI (.ci/run)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import container_check  # noqa: E402


def test_pip_config_becomes_a_build_secret_with_read_only_mounts(tmp_path, monkeypatch):
    """Index, extra indexes and find-links from `pip config list` (environment
    variables win) go into the secret's pip.conf; local index directories are mounted
    read-only at the same path (the `simple` level's parent), and the CA bundle of a
    TLS-intercepting proxy is mounted at a fixed path that the pip.conf names."""
    simple = tmp_path / "pypi" / "simple"
    simple.mkdir(parents=True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    listed = (f"global.extra-index-url='file://{simple}'\n"
              f"global.find-links='{wheels}'\n"
              f"global.cert='{ca}'\n"
              "global.constraint='/etc/xdg/pip/constraints.txt'\n")

    def fake_run(cmd, check=True, timeout=0, **kw):
        return subprocess.CompletedProcess(cmd, 0, listed, "")

    monkeypatch.setattr(container_check, "run", fake_run)
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_CERT", raising=False)
    conf, mounts = container_check.pip_config(tmp_path)
    text = conf.read_text()
    assert text.startswith("[global]\n")
    assert "index-url = https://mirror.example/simple\n" in text
    assert f"extra-index-url = file://{simple}\n" in text
    assert f"find-links = {wheels}\n" in text
    assert f"cert = {container_check.CA_IN_BUILD}\n" in text
    assert "constraint" not in text  # a host path the build cannot see
    pairs = list(zip(mounts[::2], mounts[1::2]))
    assert all(flag == "-v" for flag, _ in pairs)
    assert {m for _, m in pairs} == {f"{ca}:{container_check.CA_IN_BUILD}:ro",
                                     f"{simple.parent}:{simple.parent}:ro",
                                     f"{wheels}:{wheels}:ro"}


def test_no_pip_config_means_no_secret(tmp_path, monkeypatch):
    """Without any index setting the build gets no secret and pip uses PyPI."""
    monkeypatch.setattr(container_check, "run", lambda cmd, **kw:
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"):
        monkeypatch.delenv(var, raising=False)
    assert container_check.pip_config(tmp_path) == (None, [])


def test_dockerfile_reads_the_pip_secret_only_in_the_install_step():
    """The install step mounts the `pipconf` secret as /etc/pip.conf (never stored in
    a layer; absent, pip uses PyPI) and no other step names it."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    text = "\n".join(ln for ln in lines if not ln.lstrip().startswith("#"))
    runs = text.split("\nRUN ")[1:]
    with_secret = [r for r in runs if "id=pipconf" in r]
    assert len(with_secret) == 1
    assert "type=secret,id=pipconf,target=/etc/pip.conf" in with_secret[0]
    assert 'pip install ".[${EXTRAS}]"' in with_secret[0]


def test_runtime_probe_asks_about_the_runtime_alone_and_says_why_each_failed(monkeypatch):
    """The runtime probe runs without a network, so a host whose bridge cannot be set
    up (netavark without iptables, as CI's machine once was) still finds its runtime;
    where no runtime starts, the error carries what podman said for each."""
    calls = []

    def fake_run(cmd, check=True, timeout=0, **kw):
        calls.append(cmd)
        ok = "runc" in cmd
        return subprocess.CompletedProcess(cmd, 0 if ok else 126, "",
                                           "" if ok else "crun: cgroup mount refused")

    monkeypatch.setattr(container_check, "run", fake_run)
    opts = container_check.runtime_options("base")
    assert opts[:2] == ["--runtime", "runc"]
    assert all(c[c.index("--network") + 1] == "none" for c in calls)

    monkeypatch.setattr(container_check, "run", lambda cmd, **kw:
                        subprocess.CompletedProcess(cmd, 1, "", "netavark: no such file"))
    try:
        container_check.runtime_options("base")
    except SystemExit as e:
        assert str(e).count("netavark: no such file") == 2
    else:
        raise AssertionError("no runtime started, yet the probe returned")


def test_bridge_network_says_why_it_cannot_publish(monkeypatch):
    """bridge_network() runs a container on podman's default network: None where it
    starts, podman's error where it does not (the check then shares the host's)."""
    monkeypatch.setattr(container_check, "run", lambda cmd, **kw:
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    assert container_check.bridge_network("base", []) is None
    monkeypatch.setattr(container_check, "run", lambda cmd, **kw:
                        subprocess.CompletedProcess(
                            cmd, 127, "", "Error: netavark: No such file or directory"))
    assert "netavark" in container_check.bridge_network("base", ["--runtime", "runc"])
