"""Host mode's etcd locks over TLS and with etcd's user authentication, with
a real etcd (Debian's etcd-server 3.4) on loopback. The test makes its own
CA, server and client certificates with openssl; a second CA signs nothing
etcd knows. Credentials must never reach ckptd's log."""
import base64
import json
import subprocess

import pytest

from conftest import CKPTD
from test_host import Sandbox, drained, hosts, latest, raw_attach  # noqa: F401
from test_host_locks import Etcd

PASSWORD = "pw-7c1e3a9f-never-logged"
ROOT_PASSWORD = "root-pw-51d0b2"


def openssl(*args):
    subprocess.run(["openssl"] + [str(a) for a in args], check=True, capture_output=True)


def make_ca(d, name):
    """A CA in d: (cert, key)."""
    d.mkdir(parents=True, exist_ok=True)
    crt, key = d / (name + ".crt"), d / (name + ".key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=ckptd test " + name)
    return crt, key


def make_leaf(d, ca, name, usage):
    """A certificate for 127.0.0.1 signed by ca: (cert, key)."""
    crt, key, csr, ext = (d / (name + s) for s in (".crt", ".key", ".csr", ".ext"))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n" % usage)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
            "-out", csr, "-subj", "/CN=ckptd test " + name)
    openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", crt,
            "-days", "2", "-extfile", ext)
    return crt, key


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    ca = make_ca(d, "ca")
    p = {"ca": ca[0], "other_ca": make_ca(d, "other-ca")[0],
         # etcd's own gateway dials etcd with the server certificate: it is a client too
         "server": make_leaf(d, ca, "server", "serverAuth,clientAuth"),
         "client": make_leaf(d, ca, "client", "clientAuth")}
    return p


def tls_etcd(tmp_path, pki, *args):
    return Etcd(tmp_path, tls={"ca": str(pki["ca"]), "cert": str(pki["server"][0]), "key": str(pki["server"][1]),
                               "client": tuple(str(x) for x in pki["client"])}, args=args)


@pytest.fixture
def etcd_mtls(tmp_path, pki):
    """etcd that serves only https and asks every client for a certificate of our CA."""
    e = tls_etcd(tmp_path, pki, "--client-cert-auth", "--trusted-ca-file", str(pki["ca"]))
    yield e
    e.stop()


def client_cert(pki):
    return {"etcd_ca_file": str(pki["ca"]), "etcd_cert_file": str(pki["client"][0]),
            "etcd_key_file": str(pki["client"][1])}


def handoffs(hosts, etcd, a, b):
    """A sandbox made on a, then handed to b and back: the state and the lock follow."""
    sb = Sandbox.create(a.url, enable_checkpoint=True)
    assert sb.run("python", "counter = 7").exit_code == 0
    sid = sb.sandbox_id
    owner, token = etcd.lock(sid)
    assert owner == a.name
    sb.close()
    for rnd, (src, dst) in enumerate([(a, b), (b, a)]):
        sb2 = raw_attach(dst.url, sid)
        sb2.wait_status("SANDBOX_RUNNING")
        assert sb2.run("python", "counter += 1; print(counter)").stdout == "%d\n" % (8 + rnd)
        owner, new_token = etcd.lock(sid)
        assert owner == dst.name and new_token > token
        assert latest(hosts.volume, sid)[1] == new_token
        token = new_token
        assert drained(src)
        sb2.close()
    return sid


def start_fails(hosts, name, **cfg):
    """The instance refuses to start: its log (where ckptd says why)."""
    with pytest.raises(AssertionError) as e:
        hosts(name, **cfg)
    return str(e.value)


def test_etcd_tls_with_client_certificates_handoff(etcd_mtls, pki, hosts):
    cfg = dict(client_cert(pki), lock_backend="etcd", etcd_endpoints=[etcd_mtls.url])
    a, b = hosts("A", **cfg), hosts("B", **cfg)
    assert a.health()["lock_backend"] == "etcd"
    handoffs(hosts, etcd_mtls, a, b)


def test_etcd_tls_wrong_ca_or_no_client_certificate_is_a_clear_error(etcd_mtls, pki, hosts):
    base = dict(lock_backend="etcd", etcd_endpoints=[etcd_mtls.url])
    # etcd's certificate is not signed by the CA we trust
    log = start_fails(hosts, "A", **dict(client_cert(pki), etcd_ca_file=str(pki["other_ca"])), **base)
    assert "no etcd answers at " + etcd_mtls.url in log and "etcd_ca_file" in log, log
    # the right CA, but no client certificate: etcd closes the handshake
    log = start_fails(hosts, "B", etcd_ca_file=str(pki["ca"]), **base)
    assert "no etcd answers" in log and "client certificate" in log, log
    # a client certificate of a CA etcd does not trust
    other = make_leaf(pki["ca"].parent, (pki["other_ca"], pki["other_ca"].with_suffix(".key")), "stranger",
                      "clientAuth")
    log = start_fails(hosts, "C", etcd_ca_file=str(pki["ca"]), etcd_cert_file=str(other[0]),
                      etcd_key_file=str(other[1]), **base)
    assert "no etcd answers" in log and "client certificate" in log, log


def check_config(tmp_path, cfg):
    path = tmp_path / "check.json"
    path.write_text(json.dumps(cfg))
    out = subprocess.run([CKPTD, "--mode", "host", "--config", str(path), "--check-config"],
                         capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


def test_etcd_tls_and_auth_keys_are_checked_at_load(pki, tmp_path):
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    https = {"lock_backend": "etcd", "etcd_endpoints": ["https://127.0.0.1:2379"]}
    assert check_config(tmp_path, dict(https, **client_cert(pki), etcd_user="u",
                                       etcd_password_file=str(pw)))[0] == 0
    for bad, says in (
            ({"etcd_ca_file": str(tmp_path / "missing.crt")}, "etcd_ca_file '%s'" % (tmp_path / "missing.crt")),
            ({"etcd_cert_file": str(pki["client"][0])}, "etcd_cert_file and etcd_key_file go together"),
            ({"etcd_key_file": str(pki["client"][1])}, "etcd_cert_file and etcd_key_file go together"),
            ({"etcd_user": "u"}, "etcd_user and etcd_password_file go together"),
            ({"etcd_password_file": str(pw)}, "etcd_user and etcd_password_file go together"),
            ({"etcd_password_file": str(tmp_path / "nopw")}, "etcd_password_file"),
            ({"etcd_ca_file": 3}, "etcd_ca_file must be a string"),
            ({"etcd_ca_file": str(pki["ca"]), "etcd_endpoints": ["http://127.0.0.1:2379"]}, "is not https://"),
            ({"etcd_endpoints": ["https://u:%s@127.0.0.1:2379" % PASSWORD]}, "put no user or password in a URL"),
            ({"etcd_cafile": str(pki["ca"])}, "unknown key 'etcd_cafile' (did you mean 'etcd_ca_file'?)")):
        rc, out = check_config(tmp_path, dict(https, **bad))
        assert rc != 0 and says in out, (bad, out)
        assert PASSWORD not in out


def etcd_auth(etcd, path, body):
    r = etcd.http.post(etcd.url + path, json=body, timeout=5)
    assert r.ok, (path, r.text)
    return r.json()


def enable_auth(etcd):
    """root, and user "ckptd" whose role may read and write /ckptd/ only; the
    test's own requests then go as root."""
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    etcd_auth(etcd, "/v3/auth/user/add", {"name": "root", "password": ROOT_PASSWORD})
    etcd_auth(etcd, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    etcd_auth(etcd, "/v3/auth/user/add", {"name": "ckptd", "password": PASSWORD})
    etcd_auth(etcd, "/v3/auth/role/add", {"name": "ckptd-locks"})
    etcd_auth(etcd, "/v3/auth/role/grant", {"name": "ckptd-locks", "perm": {
        "permType": "READWRITE", "key": b64("/ckptd/"), "range_end": b64("/ckptd0")}})
    etcd_auth(etcd, "/v3/auth/user/grant", {"user": "ckptd", "role": "ckptd-locks"})
    etcd_auth(etcd, "/v3/auth/user/add", {"name": "nobody", "password": PASSWORD})
    etcd_auth(etcd, "/v3/auth/enable", {})
    login_root(etcd)


def login_root(etcd):
    etcd.http.headers.pop("Authorization", None)  # etcd refuses a login that carries a stale token
    token = etcd_auth(etcd, "/v3/auth/authenticate", {"name": "root", "password": ROOT_PASSWORD})["token"]
    etcd.http.headers["Authorization"] = token


@pytest.fixture
def etcd_auth_tls(tmp_path, pki):
    """etcd over https (a server certificate, no client certificates) with
    user authentication on."""
    e = tls_etcd(tmp_path, pki)
    enable_auth(e)
    yield e
    e.stop()


def test_etcd_user_authentication_handoff_and_token_renewal(etcd_auth_tls, pki, hosts, tmp_path):
    pw = tmp_path / "ckptd-password"
    pw.write_text(PASSWORD + "\n")
    # The lease outlives etcd's restart and both logins: a 3 s lease could
    # run out on a loaded machine (etcd checks passwords with bcrypt), and
    # the owner would then rightly stop without a checkpoint.
    cfg = dict(lock_backend="etcd", etcd_endpoints=[etcd_auth_tls.url], etcd_ca_file=str(pki["ca"]),
               etcd_user="ckptd", etcd_password_file=str(pw), lock_ttl_secs=20)
    a, b = hosts("A", **cfg), hosts("B", **cfg)
    sid = handoffs(hosts, etcd_auth_tls, a, b)

    # a restarted etcd forgets its tokens: both instances log in again, and
    # the watch stream reconnects with a fresh token
    etcd_auth_tls.restart()
    login_root(etcd_auth_tls)
    sb = raw_attach(b.url, sid)
    sb.wait_status("SANDBOX_RUNNING")
    assert sb.run("python", "counter += 1; print(counter)").stdout == "10\n"
    assert etcd_auth_tls.lock(sid)[0] == "B"
    assert drained(a)
    sb.close()
    assert "invalid auth token" in a.log() + b.log()
    for h in (a, b):
        assert PASSWORD not in h.log()


def test_etcd_authentication_errors_are_clear(etcd_auth_tls, pki, hosts, tmp_path):
    base = dict(lock_backend="etcd", etcd_endpoints=[etcd_auth_tls.url], etcd_ca_file=str(pki["ca"]))
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-" + PASSWORD)
    right = tmp_path / "right"
    right.write_text(PASSWORD)
    log = start_fails(hosts, "A", etcd_user="ckptd", etcd_password_file=str(wrong), **base)
    assert "etcd authentication failed" in log and "etcd_password_file" in log, log
    assert PASSWORD not in log
    # no user while etcd asks for one
    log = start_fails(hosts, "B", **base)
    assert "etcd has authentication enabled: set etcd_user" in log, log
    # a user whose roles do not cover /ckptd/
    log = start_fails(hosts, "C", etcd_user="nobody", etcd_password_file=str(right), **base)
    assert "permission denied" in log and "readwrite on the key prefix" in log, log
    assert PASSWORD not in log
