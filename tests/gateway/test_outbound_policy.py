"""The outbound URL policy (tasks/outbound.py): the gateway calls no address a
tenant admin should not reach, refused when the connector is saved and again at
every call, with the real ticket desk on 127.0.0.1 on both sides."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.models import Event
from portal.exceptions import ValidationFailed
from tasks import outbound
from tasks import services as task_services
from tasks.credentials import public_jwk
from tasks.exceptions import OutboundRefused
from tasks.models import Connector, Credential, Operation, Task
from tests.gateway.conftest import World
from tests.support.checks import check_entries
from tests.support.outbound import allow as outbound_allow
from tests.support.tls import make_certificates
from ticketdesk.harness import start_ticketdesk

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A TCP listener that counts the connections it accepts (and closes them)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(8)
        self.port: int = self.sock.getsockname()[1]
        self.accepted: list[str] = []  # the local address each connection reached
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn.getsockname()[0])
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    """Another service on 127.0.0.1 the gateway must never reach."""
    server = Listener()
    yield server
    server.close()


def desk_port(world: World) -> int:
    port = httpx.URL(world.desk.url).port
    assert port is not None
    return port


def save(world: World, **values: str) -> Connector:
    return task_services.connector_save(
        tenant=world.tenant, target="ticket-desk", values=values
    )


# --- save time ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_url", "http://127.0.0.1:{other}/"),  # loopback, another port
        ("base_url", "http://169.254.169.254/"),  # cloud metadata
        ("base_url", "https://169.254.169.254/latest/meta-data/"),
        ("base_url", "https://[fd00:ec2::254]/"),
        ("base_url", "http://[::1]:{desk}/"),
        ("base_url", "https://[::1]:{desk}/"),
        ("base_url", "http://localhost:{desk}/"),  # a name for loopback
        ("base_url", "https://localhost:{desk}/"),
        ("base_url", "http://2130706433:{desk}/"),  # 127.0.0.1 as a number
        ("base_url", "https://2130706433:{desk}/"),
        ("base_url", "https://[::ffff:127.0.0.1]:{desk}/"),
        ("base_url", "https://10.0.0.8/"),
        ("base_url", "https://100.64.0.1/"),
        ("base_url", "https://user:secret@desk.example/"),
        ("base_url", "https://desk.example/?next=http://127.0.0.1/"),
        ("base_url", "ftp://desk.example/"),
        ("base_url", "desk.example"),
        ("execute_path", "//evil.example/x"),
        ("execute_path", "http://127.0.0.1:{desk}/_control/reset"),
        ("execute_path", "/tickets/../_control/reset"),
        ("execute_path", "/tickets/%2e%2e/_control/reset"),
        ("execute_path", "/x@evil.example/"),
        ("lookup_path", "tickets"),
        ("lookup_path", "/tickets\\..\\_control"),
    ],
)
def test_save_refuses_what_the_policy_forbids(
    world: World, listener: Listener, field: str, value: str
):
    """The service refuses the setting, names the field, and changes nothing."""
    value = value.format(other=listener.port, desk=desk_port(world))
    before = Connector.objects.get(pk=world.connector.pk)
    with pytest.raises(ValidationFailed) as caught:
        save(world, **{field: value})
    assert caught.value.context["field"] == field
    after = Connector.objects.get(pk=world.connector.pk)
    assert getattr(after, field) == getattr(before, field)


def test_save_refuses_the_desk_itself_once_it_is_not_allowed(world: World, settings):
    # Given: the desk's host:port no longer in the allow-list.
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = []
    # Then: its own URL is refused.
    with pytest.raises(ValidationFailed, match="https"):
        save(world, base_url=world.desk.url)


def test_save_refuses_http_in_production(world: World, settings):
    """Outside development http is refused, even for a host in the allow-list."""
    settings.DEV_MODE = False
    with pytest.raises(ValidationFailed, match="https"):
        save(world, base_url=world.desk.url)
    # A public https URL and relative paths pass (no DNS at save time).
    saved = save(world, base_url="https://desk.example/v2", execute_path="/tickets")
    assert saved.base_url == "https://desk.example/v2"


def test_the_admin_form_shows_each_refusal_under_its_field(world: World):
    from console.admin.domain import ConnectorForm

    form = ConnectorForm(
        data={
            "tenant": str(world.tenant.pk),
            "target": "other-desk",
            "base_url": "https://169.254.169.254/",
            "execute_path": "//evil.example/x",
            "lookup_path": "/tickets",
            "reference_field": "ticket_id",
            "supports_idempotency_keys": "on",
            "supports_lookup": "on",
            "connect_timeout_s": "2",
            "read_timeout_s": "5",
            "max_attempts": "3",
        }
    )
    assert not form.is_valid()
    assert "metadata" in form.errors["base_url"][0]
    assert "//" in form.errors["execute_path"][0]
    assert "lookup_path" not in form.errors


# --- call time ----------------------------------------------------------------------


def refused_run(world: World, **row: str) -> dict[str, Any]:
    """Write ``row`` past the service (as an old row or a direct write would be), then
    execute through the API; return what the gateway recorded."""
    Connector.objects.filter(pk=world.connector.pk).update(**row)
    started = world.start_task()
    answer = world.execute(started)
    assert answer.status_code == 200, answer.text
    operation = Operation.objects.get(pk=started["operation"]["id"])
    task = Task.objects.get(pk=started["task"]["id"])
    checks = check_entries(operation.pk)
    return {
        "answer": answer.json(),
        "operation": operation,
        "task": task,
        "outbound": [check for check in checks if check["check"] == "outbound"],
        "called": Event.objects.filter(
            operation_id=operation.pk, code="connector.called"
        ).count(),
        "live_credentials": Credential.objects.filter(
            operation_id=operation.pk, revoked_at__isnull=True
        ).count(),
    }


def assert_refused(run: dict[str, Any]) -> None:
    assert run["answer"]["outcome"] == "failed"
    assert run["operation"].state == "failed"
    assert run["operation"].reason_code == "TARGET_FORBIDDEN"
    assert run["task"].state == "human_required"
    assert run["task"].reason_code == "TARGET_FORBIDDEN"
    [check] = run["outbound"]
    assert check["verdict"] == "refused"
    assert check["reason"] == "TARGET_FORBIDDEN"
    assert run["called"] == 0  # no call was made, so none is recorded
    assert run["live_credentials"] == 0  # the unsent credentials are revoked


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"base_url": "http://127.0.0.1:{other}"}, "https"),
        ({"base_url": "https://127.0.0.1:{other}"}, "loopback"),
        ({"base_url": "http://169.254.169.254/"}, "https"),
        ({"base_url": "https://169.254.169.254/"}, "metadata"),
        ({"base_url": "http://[::1]:{desk}/"}, "https"),
        ({"base_url": "https://localhost:{desk}/"}, "loopback"),
        ({"base_url": "http://2130706433:{desk}/"}, "https"),
        ({"base_url": "https://2130706433:{desk}/"}, "number"),
        ({"execute_path": "//127.0.0.1:{other}/x"}, "//"),
        ({"execute_path": "http://127.0.0.1:{desk}/_control/reset"}, "start with /"),
        ({"execute_path": "/tickets/../_control/reset"}, ".."),
    ],
)
def test_a_forbidden_row_is_refused_at_call_time_and_nothing_is_sent(
    world: World, listener: Listener, row: dict[str, str], why: str
):
    # Given: a connector row the service would have refused, written past it.
    values = {
        name: value.format(other=listener.port, desk=desk_port(world))
        for name, value in row.items()
    }
    # When: the agent executes.
    run = refused_run(world, **values)
    # Then: the operation fails with TARGET_FORBIDDEN, a person has the task, the
    # refusal is in the trail with the reason, and neither side saw a request.
    assert_refused(run)
    assert why in run["outbound"][0]["why"]
    assert listener.accepted == []
    assert world.desk.effects()["requests"] == 0
    assert world.tickets() == 0


def test_the_desk_without_its_allow_list_entry_is_refused(world: World, settings):
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = []
    run = refused_run(world)
    assert_refused(run)
    assert world.desk.effects()["requests"] == 0


def test_production_refuses_http_at_call_time(world: World, settings):
    settings.DEV_MODE = False  # the desk stays in the allow-list
    run = refused_run(world)
    assert_refused(run)
    assert world.desk.effects()["requests"] == 0


def test_a_name_that_resolves_to_loopback_is_refused_after_resolution(
    world: World, monkeypatch
):
    """The DNS case: a name that passes every textual check, resolving to the desk."""
    # Given: desk.example resolves to 127.0.0.1 (the module's one resolver).
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["127.0.0.1"])
    port = desk_port(world)
    saved = save(world, base_url=f"https://desk.example:{port}/")  # no DNS at save
    assert saved.base_url.startswith("https://desk.example")
    # When: the agent executes.
    run = refused_run(world)
    # Then: refused on the resolved address; the desk heard nothing.
    assert_refused(run)
    assert "resolves to 127.0.0.1" in run["outbound"][0]["why"]
    assert world.desk.effects()["requests"] == 0


def test_one_non_public_address_among_several_refuses_the_name(
    listener: Listener, monkeypatch, settings
):
    monkeypatch.setattr(
        outbound, "resolve", lambda host, port: ["93.184.216.34", "127.0.0.1"]
    )
    with pytest.raises(OutboundRefused, match=r"127\.0\.0\.1"):
        outbound.connect_addresses("mixed.example", listener.port)
    assert listener.accepted == []


# --- the allowed side, and the pinning ----------------------------------------------


def test_the_allowed_desk_is_called(world: World):
    """The desk named in the allow-list works (the other gateway tests rely on it)."""
    started = world.start_task()
    answer = world.execute(started)
    assert answer.json()["outcome"] == "verified", answer.text
    assert world.tickets() == 1


def test_the_connection_goes_to_the_address_that_was_checked(monkeypatch, settings):
    """Resolved once, checked, and the socket opened to that very address: a second
    resolution (which would answer another address) never happens."""
    # Given: listeners on 127.0.0.1 and 127.0.0.2 on one port, and a name whose
    # answer changes after the first lookup (a rebinding resolver).
    first = Listener("127.0.0.1")
    second = Listener("127.0.0.2", first.port)
    answers = iter([["127.0.0.1"]])
    lookups: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        lookups.append(host)
        return next(answers, ["127.0.0.2"])

    monkeypatch.setattr(outbound, "resolve", rebinding)
    settings.PORTAL_OUTBOUND_ALLOWED_HOSTS = [f"rebind.example:{first.port}"]
    try:
        # When: one request through the policy's transport.
        with (
            httpx.Client(transport=outbound.transport(), timeout=2) as client,
            pytest.raises(httpx.TransportError),  # the listener only hangs up
        ):
            client.get(f"http://rebind.example:{first.port}/")
    finally:
        first.close()
        second.close()
    # Then: one lookup, and the connection reached the address it returned.
    assert lookups == ["rebind.example"]
    assert first.accepted == ["127.0.0.1"]
    assert second.accepted == []


def test_a_refused_address_is_never_connected_to(listener: Listener, monkeypatch):
    checked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        checked.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(outbound, "resolve", resolver)
    with (
        httpx.Client(transport=outbound.transport(), timeout=2) as client,
        pytest.raises(OutboundRefused, match="loopback"),
    ):
        client.get(f"https://sneaky.example:{listener.port}/")
    assert checked == ["sneaky.example"]
    assert listener.accepted == []


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:10.0.0.1", True),
        ("64:ff9b::a9fe:a9fe", True),  # NAT64 of 169.254.169.254
        ("0.0.0.0", True),
        ("0.1.2.3", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("100.64.0.1", True),
        ("169.254.169.254", True),
        ("169.254.1.1", True),
        ("fe80::1", True),
        ("fd00:ec2::254", True),
        ("fc00::1", True),
        ("224.0.0.1", True),
        ("ff02::1", True),
        ("240.0.0.1", True),
        ("255.255.255.255", True),
        ("168.63.129.16", True),
        ("2002:7f00:1::", True),
        ("93.184.216.34", False),
        ("2606:2800:220:1:248:1893:25c8:1946", False),
    ],
)
def test_address_classification(address: str, refused: bool):
    assert (outbound.address_problem(address) is not None) is refused


# --- production: https to an allowed private address --------------------------------


def test_production_calls_an_allowed_https_desk_and_verifies_its_certificate(
    world: World, settings, monkeypatch, tmp_path: Path
):
    """Outside development a private desk is reached over https only, at its
    allow-listed host:port, and its certificate must chain to a CA the portal
    trusts (``SSL_CERT_FILE``, read by the policy transport's SSL context)."""
    # Given: production, the portal trusting a test CA, and a desk serving https
    # with that CA's certificate at an allow-listed host:port.
    settings.DEV_MODE = False
    trusted = make_certificates(tmp_path / "trusted")
    monkeypatch.setenv("SSL_CERT_FILE", str(trusted.ca))
    with start_ticketdesk(tls=(trusted.cert, trusted.key), ca_file=trusted.ca) as desk:
        desk.trust(public_jwk(world.connector.public_key), tenant=str(world.tenant.pk))
        outbound_allow(settings, monkeypatch, desk.url)
        save(world, base_url=desk.url)
        # When: the agent executes.
        answer = world.execute(world.start_task())
        # Then: the call is made over verified TLS and the ticket is made.
        assert answer.json()["outcome"] == "verified", answer.text
        assert len(desk.tickets()) == 1

    # Given: the same host:port, now served with a certificate of another CA.
    other = make_certificates(tmp_path / "other", label="other")
    port = httpx.URL(desk.url).port
    with start_ticketdesk(
        port=port, tls=(other.cert, other.key), ca_file=other.ca
    ) as impostor:
        impostor.trust(
            public_jwk(world.connector.public_key), tenant=str(world.tenant.pk)
        )
        # When: the agent executes again.
        started = world.start_task(1043)
        answer = world.execute(started)
        # Then: TLS verification refuses the connection: no request reaches the
        # desk, no ticket is made, and the call's error names the certificate.
        assert answer.json()["outcome"] != "verified", answer.text  # now: unknown
        assert impostor.effects()["requests"] == 0
        assert impostor.tickets() == []
        errors = Event.objects.filter(
            operation_id=started["operation"]["id"], code="connector.called"
        ).values_list("payload", flat=True)
        assert any("CERTIFICATE_VERIFY_FAILED" in str(e) for e in errors), errors
