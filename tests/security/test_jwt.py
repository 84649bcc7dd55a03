"""Sign-in with an identity provider's JWTs: keys the test makes (RSA and EC), served as a JWKS
by a small HTTP server on loopback, and each kind of token the server must refuse (401 with
``WWW-Authenticate: Bearer error="invalid_token"``)."""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import ValidationError

from service.app import create_app
from service.domain.identity import idtokens
from service.settings import Settings
from tests.security.people import ThreadServer, serve_in_thread

ISSUER = "https://idp.example/realms/lab"
AUDIENCE = "torchyard"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _jwk(key: object, kid: str) -> dict:
    public = key.public_key()  # type: ignore[attr-defined]
    if isinstance(public, rsa.RSAPublicKey):
        data = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
        data["alg"] = "RS256"
    else:
        data = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
    return {**data, "kid": kid, "use": "sig"}


class Jwks:
    """A JWKS on loopback that counts how often it is read."""

    def __init__(self) -> None:
        self.keys = [_jwk(RSA_KEY, "rsa-1"), _jwk(EC_KEY, "ec-1")]
        self.reads = 0
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                jwks.reads += 1
                body = json.dumps({"keys": jwks.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/certs"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def token(key: object = RSA_KEY, kid: str = "rsa-1", alg: str = "RS256", **claims: object) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300,
            "preferred_username": "alice", **claims}
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def idp() -> Iterator[Jwks]:
    jwks = Jwks()
    yield jwks
    jwks.httpd.shutdown()


@pytest.fixture(scope="module")
def server(idp: Jwks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    settings = Settings(home=tmp_path_factory.mktemp("jwt") / "home", cpu_slots=2, gpus="none",
                        jwt_jwks_url=idp.url, jwt_issuer=ISSUER, jwt_audience=AUDIENCE)
    app = create_app(settings, run_supervisor=False)
    with serve_in_thread(app) as running:
        with app.state.session_factory() as session:  # the users the provider's tokens name
            from service.store import identity

            identity.create_team(session, "vision")
            identity.create_user(session, "alice", "vision", "member")
            identity.create_user(session, "gone", "vision", "viewer")
            identity.update_user(session, "gone", {"disabled": True})
            session.commit()
        yield running


def _refused(server: ThreadServer, jwt_token: str) -> str:
    with server.client(jwt_token) as c:
        r = c.get("/me")
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == 'Bearer realm="torchyard", error="invalid_token"'
    return r.json()["message"]


def test_rs256_and_es256_tokens_sign_in_their_user(server: ThreadServer) -> None:
    for jwt_token in (token(), token(EC_KEY, "ec-1", "ES256")):
        with server.client(jwt_token) as c:
            me = c.get("/me").json()
            assert me == {"user": "alice", "team": "vision", "role": "member", "token_id": None,
                          "via": "jwt"}
            assert c.post("/jobs", json={"dataset": "digits", "epochs": 1}).json()["owner"] == "alice"


def test_refused_tokens(server: ThreadServer) -> None:
    now = int(time.time())
    public_pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    cases = {
        "expired": (token(exp=now - 120, iat=now - 600), "expired"),
        "not yet valid": (token(nbf=now + 120), "not valid yet"),
        "wrong issuer": (token(iss="https://evil.example"), "issuer"),
        "wrong audience": (token(aud="someone-else"), "audience"),
        "no expiry": (token(exp=None), "invalid token"),
        "unknown key": (token(OTHER_RSA, "rsa-unknown"), "no key 'rsa-unknown'"),
        "bad signature": (token(OTHER_RSA, "rsa-1"), "bad signature"),
        "alg none": (jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": now + 60,
                                 "preferred_username": "alice"}, None, algorithm="none"),
                     "algorithm 'none'"),
        "HS256 with the public key": (_hs256_with(public_pem, now), "algorithm 'HS256'"),
        "ES256 header on the RSA key": (token(EC_KEY, "rsa-1", "ES256"), "is for RS256"),
        "no such user": (token(preferred_username="mallory"), "no torchyard user"),
        "disabled user": (token(preferred_username="gone"), "disabled"),
        "no user claim": (token(preferred_username=None), "preferred_username"),
        "garbage": ("eyJhbGciOi.not-a.jwt", "well-formed"),
    }
    for kind, (jwt_token, why) in cases.items():
        message = _refused(server, jwt_token)
        assert why in message, f"{kind}: {message}"


def _hs256_with(secret: bytes, now: int) -> str:
    """The classic confusion: HS256 keyed with the provider's public key (PyJWT refuses to make
    one, so it is built by hand here)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
    body = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "exp": now + 60,
                           "preferred_username": "alice"}).encode())
    sig = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def test_an_unknown_key_refreshes_the_set_but_not_more_than_once_per_interval(
    server: ThreadServer, idp: Jwks, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _refused(server, token(OTHER_RSA, "made-up"))  # the set is now fresh
    before = idp.reads
    for n in range(5):  # a spray of made-up key ids: answered from the kept set
        _refused(server, token(OTHER_RSA, f"made-up-{n}"))
    assert idp.reads == before
    idp.keys.append(_jwk(rotated, "rsa-2"))  # the provider rotates
    monkeypatch.setattr(idtokens, "MIN_REFRESH_S", 0.0)
    with server.client(token(rotated, "rsa-2")) as c:
        assert c.get("/me").json()["user"] == "alice"
    assert idp.reads == before + 1


def test_settings_need_issuer_and_audience_with_keys(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="TORCHYARD_JWT_ISSUER and TORCHYARD_JWT_AUDIENCE"):
        Settings(home=tmp_path, jwt_jwks_url="https://idp.example/certs")
    with pytest.raises(ValidationError, match="TORCHYARD_JWT_AUDIENCE"):
        Settings(home=tmp_path, jwt_jwks_file=tmp_path / "jwks.json", jwt_issuer=ISSUER)
    with pytest.raises(ValidationError, match="https"):
        Settings(home=tmp_path, jwt_jwks_url="http://idp.example/certs", jwt_issuer=ISSUER,
                 jwt_audience=AUDIENCE)


def test_keys_from_a_file(tmp_path: Path) -> None:
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [_jwk(EC_KEY, "ec-1")]}))
    settings = Settings(home=tmp_path / "home", cpu_slots=2, gpus="none",
                        jwt_jwks_file=jwks_file, jwt_issuer=ISSUER, jwt_audience=AUDIENCE,
                        jwt_user_claim="email")
    verifier = idtokens.JwtVerifier.from_settings(settings)
    assert verifier is not None
    assert verifier.user_of(token(EC_KEY, "ec-1", "ES256", email="alice")) == "alice"
    with pytest.raises(idtokens.JwtRefused, match="'email'"):
        verifier.user_of(token(EC_KEY, "ec-1", "ES256"))
    app = create_app(settings, run_supervisor=False)  # JWTs alone close the API
    with serve_in_thread(app) as running, running.client() as anyone:
        assert anyone.get("/jobs").status_code == 401
