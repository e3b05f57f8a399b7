"""Which addresses an alert endpoint may reach (server-side request forgery), one rule for the
check when an endpoint is created or changed (``alerts.endpoints``) and for every delivery
(``alerts.transport``): docs/alerts.md, "Delivery".

An address is allowed when it is public (global, not multicast), when the settings name it
(``ALERTS_ALLOWED_ADDRESSES``), or under DEBUG. An IPv6 address that carries an IPv4 one is
judged by the IPv4 it carries, since that is what the packets reach: IPv4-mapped
(``::ffff:a.b.c.d``), IPv4-translated (``::ffff:0:a.b.c.d``), IPv4-compatible (``::a.b.c.d``),
NAT64's well-known prefix (``64:ff9b::a.b.c.d``) and 6to4 (``2002:aabb:ccdd::``). NAT64's
local-use prefix (``64:ff9b:1::/48``) embeds it where each network chooses: never public.

What a tenant is told is only that the target is not allowed, never what its host resolves to
(that would answer questions about the host's internal network).
"""

from __future__ import annotations

import ipaddress
import socket

from django.conf import settings

from llm_budgets.conf import conf

NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")

NOT_ALLOWED = (
    "the target is not allowed: alerts are sent to public addresses only (the operators may "
    "allow others: LLM_BUDGETS['ALERTS_ALLOWED_ADDRESSES'])"
)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def carried(ip: Address) -> Address:
    """The address packets to ``ip`` reach: the IPv4 address an IPv6 one embeds, else itself."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if int(ip) <= 1:
        return ip  # :: and ::1 are themselves (unspecified, loopback), not IPv4-compatible
    if ip in NAT64 or ip in IPV4_TRANSLATED or ip in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def address_allowed(address: str) -> bool:
    """Whether alerts may connect to ``address``: a public one, or one the settings allow (or
    anything under DEBUG)."""
    ip = carried(ipaddress.ip_address(address))
    if ip.is_global and not ip.is_multicast and ip not in NAT64_LOCAL:
        return True
    if settings.DEBUG:
        return True
    return any(ip in ipaddress.ip_network(n) for n in conf.ALERTS_ALLOWED_ADDRESSES)


def resolved(host: str, port: int) -> list[tuple[int, str]]:
    """Every (family, address) ``host`` resolves to; ``OSError`` when it does not."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found]


def refused(addresses: list[tuple[int, str]]) -> list[str]:
    """The addresses among ``addresses`` alerts may not reach (one is enough to refuse a host:
    a resolver may hand out any of them)."""
    return sorted({a for _, a in addresses if not address_allowed(a)})


def host_refused(host: str) -> bool:
    """Whether an endpoint's ``host`` (a name or an address) reaches an address alerts may not
    call, as far as can be told now: a name that does not resolve (yet) is not refused here,
    since each delivery resolves and checks it again."""
    if settings.DEBUG:
        return False
    try:
        addresses = [(0, str(ipaddress.ip_address(host)))]
    except ValueError:
        try:
            addresses = resolved(host, 443)
        except (OSError, UnicodeError):
            return False
    return bool(refused(addresses))
