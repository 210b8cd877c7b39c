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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from app.domain.types import DeliveryOutcome
from app.domain.webhooks import ADDRESS_REFUSED, AddressPolicy, IPAddress, Target

USER_AGENT = "jobq-webhooks/1"


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: the answer's status (if any), why it failed, and what comes next.

    ``error`` is what the job's producer may read (the delivery, the job's history); it never
    names an address the host resolved to. ``detail``, when set, is the full story for the
    server's log only.
    """

    outcome: DeliveryOutcome
    status: int | None = None
    error: str | None = None
    detail: str | None = None


def _without_addresses(text: str, host: str, addresses: Sequence[IPAddress]) -> str:
    """``text`` with every address the host resolved to written as the host instead."""
    for address in addresses:
        text = text.replace(str(address), host)
    return text


class WebhookSender:
    """Sends webhook attempts under an address policy and an overall timeout per attempt."""

    def __init__(self, *, policy: AddressPolicy, timeout_seconds: float) -> None:
        self.policy = policy
        self.timeout_seconds = timeout_seconds
        # Built once: loading the CA bundle costs milliseconds, a client per attempt nothing.
        self._tls = ssl.create_default_context()

    async def _addresses(self, target: Target) -> list[IPAddress]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM
        )
        found: list[IPAddress] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            # An IPv6 link-local address may carry a zone ("fe80::1%eth0"); the policy refuses it.
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in found:
                found.append(address)
        return found

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        """POSTs ``body`` to ``url`` with ``headers``; answers how the attempt ended."""
        target = Target.of(url)
        addresses: list[IPAddress] = []
        try:
            async with asyncio.timeout(self.timeout_seconds):
                addresses = await self._addresses(target)
                if not addresses:
                    return Attempt(DeliveryOutcome.RETRY, error=f"{target.host} has no address")
                refusal = self.policy.refusal_of_all(addresses)
                if refusal is not None:
                    return Attempt(
                        DeliveryOutcome.FAILED,
                        error=ADDRESS_REFUSED,
                        detail=f"{target.host} resolves to a refused address: {refusal}",
                    )
                return await self._post(target, addresses[0], body, headers)
        except TimeoutError:
            return Attempt(
                DeliveryOutcome.RETRY, error=f"no answer within {self.timeout_seconds:g} s"
            )
        except socket.gaierror as exc:
            return Attempt(
                DeliveryOutcome.RETRY, error=f"cannot resolve {target.host}: {exc.strerror}"
            )
        except (httpx.HTTPError, OSError) as exc:
            # A connection error may name the address it tried (an allowed internal one).
            told = f"{type(exc).__name__}: {exc}"
            shown = _without_addresses(told, target.host, addresses)
            return Attempt(
                DeliveryOutcome.RETRY,
                error=shown[:500],
                detail=told[:2000] if shown != told else None,
            )

    async def _post(
        self,
        target: Target,
        address: IPAddress,
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
