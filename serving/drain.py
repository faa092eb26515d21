"""Stop accepting connections without resetting one that already connected (Linux).

Closing a listening socket resets every connection still in its accept queue: a client whose connect()
succeeded, and which may have sent its whole request, gets no answer. So before its worker closes the socket:

1. `refuse_new_connections` attaches a socket filter that drops incoming SYNs: from then on a connect()
   gets no answer, then "connection refused" once the socket is closed (nginx's connect timeout, then the
   next server), while handshakes already under way complete (their ACKs pass);
2. after a short grace for those handshakes, `accept_backlog` takes every connection left in the queue,
   and the worker answers them;
3. the socket is closed with an empty queue.

The listening socket is shared with the gunicorn master (and, during a reload, with a new worker), and a
filter applies to the socket, not to one process. So the filter goes on only once the master has closed its
copy (`master_holds_socket`), which it does when it stops; a reload leaves the socket listening to the new
worker, and closing this worker's copy resets nothing.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from pathlib import Path

SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>; not exported by Python's socket module
HANDSHAKE_GRACE_S = 0.2  # handshakes answered before the filter complete within a round trip

_TCP_FLAGS_OFFSET = 13  # a TCP socket filter sees the packet from its TCP header
_ACK, _SYN = 0x10, 0x02


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


# Classic BPF: accept a segment carrying ACK, drop one carrying SYN alone (a new connection), accept the rest.
_DROP_NEW_CONNECTIONS = b"".join([
    _bpf(0x30, 0, 0, _TCP_FLAGS_OFFSET),  # ldb [13]
    _bpf(0x45, 2, 0, _ACK),  # jset #ACK -> accept
    _bpf(0x45, 0, 1, _SYN),  # jset #SYN -> drop, else accept
    _bpf(0x06, 0, 0, 0),  # drop: ret #0
    _bpf(0x06, 0, 0, 0xFFFFFFFF),  # accept: ret #-1
])


def refuse_new_connections(sock: socket.socket) -> bool:
    """Drop new connection attempts to the listening `sock` from now on; False where the kernel refuses."""
    program = ctypes.create_string_buffer(_DROP_NEW_CONNECTIONS)
    fprog = struct.pack("HP", len(_DROP_NEW_CONNECTIONS) // 8, ctypes.addressof(program))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True


def accept_backlog(sock: socket.socket) -> list[tuple[socket.socket, object]]:
    """Every connection waiting in the accept queue of the non-blocking listening `sock`."""
    accepted = []
    while True:
        try:
            accepted.append(sock.accept())
        except (BlockingIOError, InterruptedError):
            return accepted
        except ConnectionAbortedError:  # the client gave up while queued
            continue


def master_holds_socket(sock: socket.socket, master_pid: int) -> bool | None:
    """Whether process `master_pid` still has `sock` open (None: cannot tell, e.g. no /proc)."""
    target = f"socket:[{os.fstat(sock.fileno()).st_ino}]"
    try:
        fds = list(Path(f"/proc/{master_pid}/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:  # closed meanwhile
            continue
    return False
