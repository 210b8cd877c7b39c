"""One webhook attempt over HTTP: resolve, check every address, connect to the checked one, POST.

The host is resolved here, each address it resolves to is checked against the address policy
(app/domain/webhooks.py), and the request goes to the first of them by address, with the URL's
host in the ``Host`` header and, for https, as the TLS server name (SNI and certificate check):
no second lookup happens between the check and the connection, so a name that resolves to a
public address when checked cannot reach a private one when connecting (DNS rebinding).

No proxy from the environment, no redirects followed (a redirect could lead anywhere; a 3xx is a
failed attempt), no connection kept alive (each attempt connects to the address it checked), and
the answer's body is never read: only its status counts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from app.domain.types import DeliveryOutcome
from app.domain.webhooks import AddressPolicy, Target

USER_AGENT = "jobq-webhooks/1"


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: the answer's status (if any), why it failed, and what comes next."""

    outcome: DeliveryOutcome
    status: int | None = None
    error: str | None = None


class WebhookSender:
    """Sends webhook attempts under an address policy and an overall timeout per attempt."""

    def __init__(self, *, policy: AddressPolicy, timeout_seconds: float) -> None:
        self.policy = policy
        self.timeout_seconds = timeout_seconds
        # Built once: loading the CA bundle costs milliseconds, a client per attempt nothing.
        self._tls = ssl.create_default_context()

    async def _addresses(
        self, target: Target
    ) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM
        )
        found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            # An IPv6 link-local address may carry a zone ("fe80::1%eth0"); the policy refuses it.
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in found:
                found.append(address)
        return found

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        """POSTs ``body`` to ``url`` with ``headers``; answers how the attempt ended."""
        target = Target.of(url)
        try:
            async with asyncio.timeout(self.timeout_seconds):
                addresses = await self._addresses(target)
                if not addresses:
                    return Attempt(DeliveryOutcome.RETRY, error=f"{target.host} has no address")
                refusal = self.policy.refusal_of_all(addresses)
                if refusal is not None:
                    return Attempt(DeliveryOutcome.FAILED, error=refusal)
                return await self._post(target, addresses[0], body, headers)
        except TimeoutError:
            return Attempt(
                DeliveryOutcome.RETRY, error=f"no answer within {self.timeout_seconds:g} s"
            )
        except socket.gaierror as exc:
            return Attempt(
                DeliveryOutcome.RETRY, error=f"cannot resolve {target.host}: {exc.strerror}"
            )
        except httpx.HTTPError as exc:
            return Attempt(DeliveryOutcome.RETRY, error=f"{type(exc).__name__}: {exc}"[:500])
        except OSError as exc:
            return Attempt(DeliveryOutcome.RETRY, error=f"{type(exc).__name__}: {exc}"[:500])

    async def _post(
        self,
        target: Target,
        address: ipaddress.IPv4Address | ipaddress.IPv6Address,
        body: bytes,
        headers: Mapping[str, str],
    ) -> Attempt:
        pinned, host_header = target.pinned(address)
        extensions: dict[str, str] = {}
        if target.scheme == "https" and _is_name(target.host):
            extensions["sni_hostname"] = target.host
        async with (
            httpx.AsyncClient(
                verify=self._tls,
                trust_env=False,
                follow_redirects=False,
                timeout=self.timeout_seconds,
                limits=httpx.Limits(max_keepalive_connections=0),
            ) as client,
            client.stream(
                "POST",
                pinned,
                content=body,
                headers={
                    **headers,
                    "Host": host_header,
                    "Content-Type": "application/json",
                    "User-Agent": USER_AGENT,
                },
                extensions=extensions,
            ) as response,
        ):
            status = response.status_code
        if 200 <= status < 300:
            return Attempt(DeliveryOutcome.DELIVERED, status=status)
        return Attempt(DeliveryOutcome.RETRY, status=status, error=f"answered HTTP {status}")


def _is_name(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return True
    return False
