"""Completion webhooks, the pure part: which addresses may be called, URL rules, signatures.

A callback is a request the service makes on a producer's behalf, so it must not become a way
into the service's own network (SSRF): every address a callback's host resolves to is checked
against :class:`AddressPolicy` before connecting, and the connection goes to the address that
was checked. By default only globally routable unicast addresses are allowed: loopback, private
(RFC 1918, IPv6 ULA), link-local, multicast, unspecified, reserved, CGNAT (100.64.0.0/10) and
documentation ranges are refused, and so are IPv6 forms embedding such an IPv4 address
(IPv4-mapped, 6to4, NAT64). ``JOBQ_WEBHOOK_ALLOWED_NETWORKS`` lists ranges allowed anyway.

The signature is Stripe's scheme: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``,
with one ``v1`` per secret in force (two during a rotation's grace period).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SIGNATURE_HEADER = "Jobq-Signature"
DELIVERY_ID_HEADER = "Jobq-Delivery-Id"
DELIVERY_ATTEMPT_HEADER = "Jobq-Delivery-Attempt"
SECRET_PREFIX = "whsec_"
# What a producer is told when a callback's host resolves to an address the policy refuses:
# naming the address (or its kind) would map the service's internal DNS for anyone who can
# enqueue. The address goes to the server's log, with the job and the delivery.
ADDRESS_REFUSED = (
    "the address this URL resolves to is not allowed by the webhook address policy "
    "(the service's log names it)"
)

# Ranges Python's ipaddress counts as global (or does not flag) that a callback must not reach.
_REFUSED_EXTRA: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("100.64.0.0/10"),  # CGNAT (RFC 6598)
    ipaddress.ip_network("192.0.0.0/24"),  # IETF protocol assignments
    ipaddress.ip_network("198.18.0.0/15"),  # benchmarking
    ipaddress.ip_network("2001:db8::/32"),  # documentation
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Host names that always mean this machine (RFC 6761), refused without a lookup.
_LOOPBACK_NAMES = ("localhost", "localhost.")


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """Comma-separated CIDR ranges (``10.0.0.0/8, ::1/128``; a bare address is a /32 or /128);
    ``ValueError`` naming the first unusable one."""
    networks: list[IPNetwork] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP network (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _refused_kind(address: IPAddress) -> str | None:
    """Why an address is not a public unicast one, or ``None`` when it is."""
    checks = (
        (address.is_loopback, "loopback"),
        (address.is_unspecified, "unspecified"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_reserved, "reserved"),
        (address.is_private, "private"),
        (any(address in n for n in _REFUSED_EXTRA if n.version == address.version), "reserved"),
        (not address.is_global, "not global"),
    )
    for refused, kind in checks:
        if refused:
            return kind
    return None


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses callbacks may reach: public unicast ones, and the ``allowed`` ranges."""

    allowed: tuple[IPNetwork, ...] = ()

    def _allowed(self, address: IPAddress) -> bool:
        return any(address.version == n.version and address in n for n in self.allowed)

    def refusal(self, address: IPAddress | str) -> str | None:
        """Why a callback may not connect to ``address``, or ``None`` when it may."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if self._allowed(ip):
            return None
        if isinstance(ip, ipaddress.IPv6Address) and (v4 := _embedded_v4(ip)) is not None:
            # An IPv6 form of an IPv4 address reaches that address: judged as it.
            if self._allowed(v4):
                return None
            kind = _refused_kind(v4)
        else:
            kind = _refused_kind(ip)
        if kind is None:
            return None
        return (
            f"address {ip} is {kind}: refused by the webhook address policy "
            "(allow its range with JOBQ_WEBHOOK_ALLOWED_NETWORKS)"
        )

    def refusal_of_all(self, addresses: Iterable[IPAddress | str]) -> str | None:
        """The first refusal among every address a host resolved to (one refused is enough)."""
        for address in addresses:
            if (why := self.refusal(address)) is not None:
                return why
        return None


def literal_address(host: str) -> IPAddress | None:
    """The IP address a URL's host is written as, if it is one (``[::1]`` included)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def callback_url_problem(url: str, *, max_chars: int, policy: AddressPolicy) -> str | None:
    """Why ``url`` cannot be a callback (checked at enqueue, before any lookup), or ``None``.

    An absolute http or https URL with a host, no user or password, at most ``max_chars`` long;
    a host written as an IP address, or named ``localhost``, must pass the address policy (a
    host name is checked when the delivery resolves it).
    """
    if len(url) > max_chars:
        return f"at most {max_chars} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "must be an absolute http:// or https:// URL"
    host = parts.hostname
    if not host:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user or password (put a token in the path or query)"
    if any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in url):
        return "must not contain spaces or control characters"
    if port == 0:
        return "port 0 cannot be called"
    if host.lower() in _LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return policy.refusal_of_all(("127.0.0.1", "::1"))
    literal = literal_address(host)
    if literal is not None:
        return policy.refusal(literal)
    return None


@dataclass(frozen=True)
class Target:
    """Where a delivery connects: the URL as given, and its parts the sender needs."""

    url: str
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Target:
        """The parts of a URL that passed :func:`callback_url_problem`."""
        parts: SplitResult = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(url=url, scheme=parts.scheme, host=host, port=port)

    def pinned(self, address: IPAddress) -> tuple[str, str]:
        """The URL with its host replaced by ``address``, and the Host header to send."""
        parts = urlsplit(self.url)
        shown = f"[{address}]" if address.version == 6 else str(address)
        netloc = f"{shown}:{self.port}"
        default_port = 443 if self.scheme == "https" else 80
        host_header = parts.netloc.rsplit("@", 1)[-1]
        if parts.port is None or parts.port == default_port:
            host_header = f"[{self.host}]" if ":" in self.host else self.host
        return parts._replace(netloc=netloc).geturl(), host_header


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``"<timestamp>.<body>"`` under ``secret``."""
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(timestamp: int, body: bytes, keys: Sequence[str]) -> str:
    """The ``Jobq-Signature`` value: the timestamp, then one ``v1`` per secret in force."""
    return ",".join([f"t={timestamp}", *(f"v1={sign(k, timestamp, body)}" for k in keys)])


def new_webhook_secret() -> str:
    """A fresh signing secret: ``whsec_`` and 64 hex digits (256 random bits)."""
    return SECRET_PREFIX + secrets.token_hex(32)
