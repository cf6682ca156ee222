"""The collectives' network, checked on each node before any rank starts.

A multi-node run whose backend is told to use an interface this host does not have
(``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``, ``HCCL_SOCKET_IFNAME``), an address it
does not own (``HCCL_IF_IP``) or a port base out of range (``HCCL_IF_BASE_PORT``) fails
late and cryptically inside the backend (gloo: "no such device", NCCL/HCCL: a timeout
minutes later). Here it is refused in one line, on the node that has it wrong, and the
report states which interface reaches the rendezvous from each node: a multi-node figure
is comparable only with its network named.

The interface-list syntax is each backend's: gloo takes exact names separated by commas;
NCCL and HCCL take name prefixes, ``=`` before the list for exact names and ``^`` to
exclude (an exclusion list is not checked: it names what not to use).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from typing import Any

from ..errors import BadInputError

__all__ = [
    "IFNAME_VARIABLE",
    "check_network",
    "interface_for",
    "local_interfaces",
]

#: The variable naming the interfaces each backend's sockets use.
IFNAME_VARIABLE = {
    "gloo": "GLOO_SOCKET_IFNAME",
    "nccl": "NCCL_SOCKET_IFNAME",
    "hccl": "HCCL_SOCKET_IFNAME",
}
#: Linux ``SIOCGIFADDR``: an interface's IPv4 address.
_SIOCGIFADDR = 0x8915
#: HCCL listens on ``HCCL_IF_BASE_PORT`` and the ports after it, one per device.
_PORT_SPAN = 16


def local_interfaces() -> dict[str, str | None]:
    """This host's interfaces, each with its IPv4 address (None: none, or not readable
    here, e.g. off Linux)."""
    found: dict[str, str | None] = {}
    try:
        names = [name for _index, name in socket.if_nameindex()]
    except OSError:
        return found
    with contextlib.ExitStack() as stack:
        try:
            import fcntl

            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        except (ImportError, OSError):
            return dict.fromkeys(names)
        for name in names:
            try:
                raw = fcntl.ioctl(
                    sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
                found[name] = socket.inet_ntoa(raw[20:24])
            except OSError:
                found[name] = None
    return found


def interface_for(host: str, port: int) -> tuple[str | None, str | None]:
    """(local address, interface) this host would use to reach ``host:port`` (a
    connected UDP socket: routed, nothing sent); (None, None) when unresolvable."""
    try:
        info = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(info[0][4])
            local = str(sock.getsockname()[0])
    except (OSError, IndexError):
        return None, None
    owner = next((n for n, a in local_interfaces().items() if a == local), None)
    return local, owner


def _matches(spec: str, names: list[str], exact: bool) -> bool:
    return spec in names if exact else any(n.startswith(spec) for n in names)


def _check_ifname(variable: str, value: str, names: list[str]) -> list[str]:
    """The interfaces ``value`` selects; BadInputError naming the first entry that selects
    none (``^...``: an exclusion list, nothing checked)."""
    text = value.strip()
    if not text or text.startswith("^"):
        return []
    exact = variable == "GLOO_SOCKET_IFNAME" or text.startswith("=")
    entries = [e.strip() for e in text.lstrip("=").split(",") if e.strip()]
    for entry in entries:
        if not _matches(entry, names, exact):
            kind = "interface" if exact else "interface starting with"
            raise BadInputError(
                f"{variable}={value[:80]}: no {kind} {entry[:40]!r} on {socket.gethostname()} "
                f"(it has {', '.join(names) or 'none'}): name one of these, or unset it"
            )
    return [n for n in names if any(_matches(e, [n], exact) for e in entries)]


def check_network(backend: str, host: str, port: int) -> dict[str, Any]:
    """Refuse this node's interface settings for ``backend`` when they cannot work here;
    else what the report states: the interfaces the variable selects, and the local
    address and interface that reach the rendezvous ``host:port``."""
    interfaces = local_interfaces()
    names = list(interfaces)
    variable = IFNAME_VARIABLE.get(backend)
    value = os.environ.get(variable) if variable else None
    selected = _check_ifname(variable, value, names) if variable and value else []
    if backend == "hccl":
        _check_hccl(interfaces)
    local, owner = interface_for(host, port)
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "variable": variable,
        "selected": selected if value else None,
        "rendezvous": f"{host}:{port}",
        "route_address": local,
        "route_interface": owner,
    }
    if value and owner is not None and selected and owner not in selected:
        # Not refused: the rendezvous store may sit on another network than the data.
        out["note"] = (
            f"{variable} selects {', '.join(selected)} but the rendezvous is reached through "
            f"{owner}: the collectives use another network than the rendezvous"
        )
    return out


def _check_hccl(interfaces: dict[str, str | None]) -> None:
    address = os.environ.get("HCCL_IF_IP")
    if address:
        try:
            ipaddress.ip_address(address.strip())
        except ValueError:
            raise BadInputError(
                f"HCCL_IF_IP={address[:60]!r} is not an IP address: set it to this host's "
                "address on the network the NPUs talk over"
            ) from None
        owned = {a for a in interfaces.values() if a}
        if owned and address.strip() not in owned:
            raise BadInputError(
                f"HCCL_IF_IP={address.strip()} is not an address of {socket.gethostname()} "
                f"(it has {', '.join(sorted(owned))}): set it to one of these on every node"
            )
    base = os.environ.get("HCCL_IF_BASE_PORT")
    if base is not None and not (
        base.strip().isascii()
        and base.strip().isdigit()
        and 1024 <= int(base) <= 65535 - _PORT_SPAN
    ):
        raise BadInputError(
            f"HCCL_IF_BASE_PORT={base[:20]!r}: use a port from 1024 to {65535 - _PORT_SPAN} "
            f"(HCCL listens on it and the {_PORT_SPAN - 1} after it)"
        )
