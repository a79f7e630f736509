"""NIC sampler: RDMA port counters and network-interface statistics from sysfs.

Sources, under an injected sysfs root (``/sys`` in production, a fake tree in tests):

* ``class/infiniband/<dev>/ports/<port>/counters`` and ``hw_counters`` (mlx5 and
  friends). ``port_xmit_data`` / ``port_rcv_data`` count 4-byte words (per the
  InfiniBand spec), so they are multiplied by 4 into bytes. Congestion and
  error counters (CNP, ECN, out-of-sequence, link downs, symbol errors, transmit
  wait) are taken from whichever of the two folders has them.
* ``class/net/<if>/statistics``, ``speed`` (Mb/s) and ``operstate``.

Counters stay cumulative (``*_total``); rates are computed downstream. A
counter a driver does not expose is absent from the event (null). PFC pause
frames appear in sysfs only where the driver puts them there (mlx5 keeps them in
``ethtool -S`` as ``rx_pause_ctrl_phy``/``tx_pause_ctrl_phy``), so they are
often null.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

# event field -> candidate file names in ports/<p>/counters or ports/<p>/hw_counters
_IB_FIELDS: dict[str, tuple[str, ...]] = {
    "tx_packets_total": ("port_xmit_packets",),
    "rx_packets_total": ("port_rcv_packets",),
    "rx_errors_total": ("port_rcv_errors",),
    "tx_errors_total": ("port_xmit_discards",),
    "rx_drops_total": ("out_of_buffer", "rx_discards_phy"),
    "tx_pause_total": ("tx_pause_ctrl_phy", "port_xmit_pause"),
    "rx_pause_total": ("rx_pause_ctrl_phy", "port_rcv_pause"),
    "cnp_sent_total": ("np_cnp_sent",),
    "cnp_handled_total": ("rp_cnp_handled",),
    "ecn_marked_total": ("np_ecn_marked_roce_packets",),
    "out_of_sequence_total": ("out_of_sequence",),
    "link_downed_total": ("link_downed",),
    "symbol_errors_total": ("symbol_error",),
    "xmit_wait_total": ("port_xmit_wait",),
}
_NET_FIELDS: dict[str, str] = {
    "tx_bytes_total": "tx_bytes",
    "rx_bytes_total": "rx_bytes",
    "tx_packets_total": "tx_packets",
    "rx_packets_total": "rx_packets",
    "rx_errors_total": "rx_errors",
    "tx_errors_total": "tx_errors",
    "rx_drops_total": "rx_dropped",
}
_NET_STATE = {"up": "up", "down": "down", "lowerlayerdown": "down", "notpresent": "down"}
_WORD = 4  # port_xmit_data / port_rcv_data unit, bytes


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class NicSampler:
    """One ``nic`` event per RDMA port and per network interface on each ``sample()``.

    sys_root: the sysfs mount. include_net: also sample /sys/class/net interfaces.
    rescan_s: how often to look for devices that appeared or went away, seconds.
    """

    name = "nic"

    def __init__(self, host: str | None = None, sys_root: str = "/sys",
                 include_net: bool = True, rescan_s: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.host = host or socket.gethostname()
        self.root = sys_root
        self.include_net = include_net
        self.rescan_s = rescan_s
        self.clock = clock
        self._ports: list[tuple[str, int, dict[str, str]]] = []
        self._nets: list[tuple[str, str]] = []
        self._scanned = -1e18

    def _scan(self) -> None:
        ib = os.path.join(self.root, "class", "infiniband")
        self._ports = []
        for dev in _listdir(ib):
            for port in _listdir(os.path.join(ib, dev, "ports")):
                if not port.isdigit():
                    continue
                base = os.path.join(ib, dev, "ports", port)
                files = {n: os.path.join(base, "counters", n)
                         for n in _listdir(os.path.join(base, "counters"))}
                files.update({n: os.path.join(base, "hw_counters", n)
                              for n in _listdir(os.path.join(base, "hw_counters"))})
                files["rate"] = os.path.join(base, "rate")
                files["state"] = os.path.join(base, "state")
                self._ports.append((dev, int(port), files))
        net = os.path.join(self.root, "class", "net")
        self._nets = [(name, os.path.join(net, name)) for name in _listdir(net)
                      if self.include_net]
        self._scanned = time.monotonic()

    def sample(self) -> list[dict]:
        if time.monotonic() - self._scanned >= self.rescan_s:
            self._scan()
        ts = self.clock()
        out = [ev for dev, port, files in self._ports
               if (ev := self._ib_event(ts, dev, port, files)) is not None]
        out += [ev for name, path in self._nets if (ev := self._net_event(ts, name, path))]
        return out

    def _ib_event(self, ts: float, dev: str, port: int, files: dict[str, str]) -> dict | None:
        tx = _read_int(files.get("port_xmit_data", ""))
        rx = _read_int(files.get("port_rcv_data", ""))
        if tx is None or rx is None:
            return None  # the port went away between scans
        ev: dict = {"v": 1, "kind": "nic", "ts": ts, "host": self.host, "nic": dev,
                    "port": port, "tx_bytes_total": tx * _WORD, "rx_bytes_total": rx * _WORD}
        for field, names in _IB_FIELDS.items():
            for name in names:
                if name in files:
                    ev[field] = _read_int(files[name])
                    break
        state = _read(files["state"])  # e.g. "4: ACTIVE"
        ev["state"] = None if state is None else ("up" if "ACTIVE" in state else "down")
        rate = _read(files["rate"])  # e.g. "200 Gb/sec (4X HDR)"
        try:
            ev["speed_gbps"] = float(rate.split()[0]) if rate else None
        except ValueError:
            ev["speed_gbps"] = None
        return ev

    def _net_event(self, ts: float, name: str, path: str) -> dict | None:
        stats = os.path.join(path, "statistics")
        values = {f: _read_int(os.path.join(stats, n)) for f, n in _NET_FIELDS.items()}
        if values["tx_bytes_total"] is None or values["rx_bytes_total"] is None:
            return None
        speed = _read_int(os.path.join(path, "speed"))  # Mb/s; EINVAL or -1 when unknown
        port = _read_int(os.path.join(path, "dev_port"))
        ev: dict = {"v": 1, "kind": "nic", "ts": ts, "host": self.host, "nic": name,
                    "port": port if port is not None else 0, **values,
                    "state": _NET_STATE.get(_read(os.path.join(path, "operstate")) or ""),
                    "speed_gbps": speed / 1000.0 if speed is not None and speed > 0 else None}
        return ev
