"""Where the processes of a multi-process LoRA run meet: `free_port`, a free TCP port on 127.0.0.1, for
accelerate's launcher (launch.py) and for the process group a one-process ZeRO run starts itself (zero.py).
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
