"""Certificates made at test time with the `openssl` command-line tool: a CA, a
server certificate for localhost and 127.0.0.1, a client certificate signed by the
CA, and one signed by another CA (a client the server must not trust). EC P-256
keys, valid two days; each call makes a fresh set in `folder`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True,
                   timeout=60)


def _ca(folder: Path, name: str) -> None:
    _run("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.crt",
         "-days", "2", "-subj", f"/CN={name}",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)


def _leaf(folder: Path, name: str, ca: str, extensions: str) -> None:
    (folder / f"{name}.ext").write_text(extensions)
    _run("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={name}", cwd=folder)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
         "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
         "-extfile", f"{name}.ext", cwd=folder)


def make_certs(folder: Path) -> SimpleNamespace:
    """Paths (str) of ca, server_cert, server_key, client_cert, client_key,
    stranger_cert, stranger_key (a client certificate from an unknown CA)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca")
    _ca(folder, "other-ca")
    _leaf(folder, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                  "extendedKeyUsage=serverAuth\n")
    _leaf(folder, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _leaf(folder, "stranger", "other-ca", "extendedKeyUsage=clientAuth\n")
    p = lambda name: str(folder / name)  # noqa: E731
    return SimpleNamespace(ca=p("ca.crt"), server_cert=p("server.crt"),
                           server_key=p("server.key"), client_cert=p("client.crt"),
                           client_key=p("client.key"), stranger_cert=p("stranger.crt"),
                           stranger_key=p("stranger.key"))
