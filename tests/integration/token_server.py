"""A small Docker/OCI token service for docker-registry's token auth: it
checks Basic credentials and answers a JWT signed with RS256, its
certificate in the x5c header (the registry trusts the certificate as
its rootcertbundle). Only for the tests."""
import base64
import datetime
import http.server
import json
import threading
import time
import urllib.parse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, base, user, password):
        base.mkdir(parents=True, exist_ok=True)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ckptd test token issuer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert_obj = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                         .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                         .not_valid_before(now - datetime.timedelta(days=1))
                         .not_valid_after(now + datetime.timedelta(days=1))
                         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                         .sign(self.key, hashes.SHA256()))
        self.cert = str(base / "cert.pem")
        with open(self.cert, "wb") as f:
            f.write(self.cert_obj.public_bytes(serialization.Encoding.PEM))
        self.expect = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.issued = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.headers.get("Authorization") != server.expect:
                    self.send_response(401)
                    self.end_headers()
                    return
                q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                body = json.dumps({"token": server.token(q.get("service", [""])[0], q.get("scope", []))})
                server.issued += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def token(self, service, scopes):
        access = []
        for s in scopes:
            parts = s.split(":")
            if len(parts) >= 3:
                access.append({"type": parts[0], "name": ":".join(parts[1:-1]),
                               "actions": parts[-1].split(",")})
        now = int(time.time())
        der = self.cert_obj.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": "test-issuer", "sub": "ckptuser", "aud": service, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": str(now) + str(self.issued), "access": access}
        signing = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
        sig = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing + "." + b64url(sig)

    def stop(self):
        self.httpd.shutdown()
