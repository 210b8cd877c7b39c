"""Completion webhooks, the pure part: the address policy, callback URL rules, signatures."""

from __future__ import annotations

import ipaddress

import pytest

from app.domain.webhooks import (
    AddressPolicy,
    Target,
    callback_url_problem,
    parse_networks,
    signature_header,
)
from app.maintenance.webhook_sender import _without_addresses
from app.maintenance.webhooks import WebhookConfig
from app.settings import Settings
from jobq_client import InvalidSignature, verify_signature

DEFAULT = AddressPolicy()


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "reserved"),  # CGNAT
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
    ],
)
def test_special_addresses_are_refused_by_default(address: str, kind: str) -> None:
    why = DEFAULT.refusal(address)
    assert why is not None and f"is {kind}:" in why, why
    assert "JOBQ_WEBHOOK_ALLOWED_NETWORKS" in why


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "64:ff9b::101:101"]
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert DEFAULT.refusal(address) is None


def test_allowed_networks_open_exactly_their_ranges() -> None:
    policy = AddressPolicy(parse_networks(" 127.0.0.1/32, 10.1.0.0/16,::1 "))
    assert policy.refusal("127.0.0.1") is None
    assert policy.refusal("::1") is None
    assert policy.refusal("10.1.200.3") is None
    assert policy.refusal("::ffff:10.1.0.5") is None  # the mapped form of an allowed address
    assert policy.refusal("127.0.0.2") is not None
    assert policy.refusal("10.2.0.1") is not None
    # One refused address among a host's addresses refuses the host.
    assert policy.refusal_of_all(["127.0.0.1", "192.168.0.1"]) is not None


def test_unusable_networks_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="not an IP network"):
        parse_networks("10.0.0.0/8, nonsense")
    with pytest.raises(ValueError, match="not an IP network"):
        Settings(webhook_allowed_networks="10.0.0.0/33")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.com/x", "http:// or https://"),
        ("/relative", "http:// or https://"),
        ("https:///nohost", "must name a host"),
        ("https://user:pw@example.com/", "user or password"),
        ("https://example.com/a b", "spaces"),
        ("https://example.com:99999/", "not a URL"),
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://localhost/hook", "loopback"),
        ("http://api.localhost/hook", "loopback"),
        ("http://10.0.0.5/hook", "private"),
        ("https://example.com/" + "x" * 100, "at most 64 characters"),
    ],
)
def test_callback_urls_refused_at_enqueue(url: str, problem: str) -> None:
    found = callback_url_problem(url, max_chars=64, policy=DEFAULT)
    assert found is not None and problem in found, found


def test_callback_urls_accepted_at_enqueue() -> None:
    for url in ("https://example.com/hook?t=1", "http://93.184.216.34:8080/x"):
        assert callback_url_problem(url, max_chars=2048, policy=DEFAULT) is None
    loopback = AddressPolicy(parse_networks("127.0.0.0/8,::1/128"))
    assert callback_url_problem("http://localhost:81/h", max_chars=99, policy=loopback) is None


def test_a_target_is_pinned_to_the_checked_address_with_its_host_header() -> None:
    target = Target.of("https://hooks.example.com/in?x=1")
    url, host = target.pinned(ipaddress.ip_address("93.184.216.34"))
    assert (url, host) == ("https://93.184.216.34:443/in?x=1", "hooks.example.com")
    url, host = Target.of("http://hooks.example.com:8080/in").pinned(
        ipaddress.ip_address("2606:4700::1")
    )
    assert (url, host) == ("http://[2606:4700::1]:8080/in", "hooks.example.com:8080")


def test_signatures_verify_with_the_client_and_refuse_anything_else() -> None:
    body = b'{"job_id": 1}'
    header = signature_header(1_700_000_000, body, ["whsec_new", "whsec_old"])
    assert verify_signature(body, header, "whsec_new", now=1_700_000_100) == 1_700_000_000
    assert verify_signature(body, header, ["x", "whsec_old"], now=1_700_000_100)
    with pytest.raises(InvalidSignature, match="no signature matches"):
        verify_signature(body + b" ", header, "whsec_new", now=1_700_000_000)
    with pytest.raises(InvalidSignature, match="tolerance"):
        verify_signature(body, header, "whsec_new", now=1_700_000_301)
    with pytest.raises(InvalidSignature, match="malformed"):
        verify_signature(body, "v1=abc", "whsec_new")
    with pytest.raises(InvalidSignature, match="no Jobq-Signature"):
        verify_signature(body, None, "whsec_new")


def test_the_loop_config_is_checked_up_front() -> None:
    with pytest.raises(ValueError, match="twice"):
        WebhookConfig(timeout_seconds=10, in_flight_seconds=15)
    with pytest.raises(ValueError, match="backoff_base"):
        WebhookConfig(backoff_base_seconds=10, backoff_cap_seconds=5)
    with pytest.raises(ValueError, match="in_flight"):
        Settings(webhook_timeout_seconds=40)


def test_the_job_page_tells_each_delivery_attempt() -> None:
    from datetime import UTC, datetime

    from app.dashboard.views import timeline
    from app.domain.records import JobHistoryEntry

    def event(**data: object) -> JobHistoryEntry:
        at = datetime(2026, 12, 3, tzinfo=UTC)
        return JobHistoryEntry(1, at, "webhook", 1, None, None, "i", data, None)

    lines = timeline(
        [
            event(delivery_attempt=1, url="https://x.test/h", outcome="retrying", status_code=500),
            event(delivery_attempt=2, url="https://x.test/h", outcome="delivered", status_code=204),
            event(delivery_attempt=1, url="http://10.0.0.1/", outcome="failed", error="refused"),
        ]
    )
    assert [(line.kind, line.what.split(":")[-1].strip()[:12]) for line in lines] == [
        ("error", "HTTP 500 — n"),
        ("finished", "delivered (H"),
        ("dead", "refused"),
    ]


def test_an_attempts_error_names_the_host_not_the_addresses_it_resolved_to() -> None:
    told = "ConnectError: [Errno 111] Connect call failed ('10.0.0.7', 80), ('fd00::7', 80)"
    addresses = [ipaddress.ip_address("10.0.0.7"), ipaddress.ip_address("fd00::7")]
    shown = _without_addresses(told, "hooks.internal", addresses)
    assert shown == (
        "ConnectError: [Errno 111] Connect call failed ('hooks.internal', 80), "
        "('hooks.internal', 80)"
    )
