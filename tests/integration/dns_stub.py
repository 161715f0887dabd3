"""A name server for tests: answers A queries over UDP on 127.0.0.1 from a
table the test changes while clients run, as cluster DNS does when a pod
comes back at a new address. gRPC's DNS resolver (c-ares, in the C client
and in grpcio) asks it when the target names it as its authority:
``dns://127.0.0.1:PORT/NAME:PORT``. Every answer has TTL 0 and every query
is counted per name, so a test can tell the client asked again.

Only what a resolver's A/AAAA lookup needs: the question is read, anything
after it ignored; a known name gets its addresses (A: one record each, as
a headless Service's name has one per pod) or an empty answer (AAAA), an
unknown one NXDOMAIN.
"""

from __future__ import annotations

import socket
import struct
import threading

TYPE_A, CLASS_IN = 1, 1


class NameServer:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.table: dict[str, tuple[str, ...]] = {}
        self.asked: dict[str, int] = {}
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def authority(self) -> str:
        return f"dns://127.0.0.1:{self.port}/"

    def set(self, name: str, *addresses: str) -> None:
        with self.lock:
            self.table[name.lower()] = addresses

    def queries(self, name: str) -> int:
        with self.lock:
            return self.asked.get(name.lower(), 0)

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                msg, peer = self.sock.recvfrom(4096)
            except OSError:
                return  # Closed.
            reply = self._answer(msg)
            if reply:
                try:
                    self.sock.sendto(reply, peer)
                except OSError:
                    return

    def _answer(self, msg: bytes) -> bytes | None:
        if len(msg) < 12:
            return None
        qid, _flags, qdcount = struct.unpack(">HHH", msg[:6])
        if qdcount != 1:
            return None
        labels, i = [], 12
        while i < len(msg) and msg[i]:
            n = msg[i]
            labels.append(msg[i + 1 : i + 1 + n].decode("ascii", "replace"))
            i += 1 + n
        if i + 5 > len(msg):
            return None
        question = msg[12 : i + 5]
        qtype, _qclass = struct.unpack(">HH", msg[i + 1 : i + 5])
        name = ".".join(labels).lower()
        with self.lock:
            addresses = self.table.get(name)
            if qtype == TYPE_A:
                self.asked[name] = self.asked.get(name, 0) + 1
        rcode = 0 if addresses else 3  # NXDOMAIN
        records = list(addresses or ()) if qtype == TYPE_A else []
        answers = b"".join(
            struct.pack(">HHHIH", 0xC00C, TYPE_A, CLASS_IN, 0, 4) + socket.inet_aton(a)
            for a in records
        )
        # QR, AA, RD, RA and the rcode; one question, the answers.
        head = struct.pack(">HHHHHH", qid, 0x8580 | rcode, 1, len(records), 0, 0)
        return head + question + answers
