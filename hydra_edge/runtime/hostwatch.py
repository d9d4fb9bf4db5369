"""Stop a device program as soon as the host that started it goes away.

A command started over ssh or adb gets no signal when the host's client is stopped (Ctrl-C) or
killed, or when the link drops: it would compute on until its next write fails, for as long as an
artefact takes to time. So the host keeps the command's stdin open for exactly as long as it
wants the command to live, and end of file on stdin means the host is gone.
"""

from __future__ import annotations

import os
import threading

HOST_GONE_EXIT = 129  # 128 + SIGHUP: what a hung-up terminal would have ended it with


def exit_when_stdin_closes() -> None:
    """Watch stdin in a daemon thread and end the process the moment it reaches end of file.

    Only for programs started by the host with a stdin it holds open (``--exit-with-host``): run
    by hand from a terminal, stdin closes only on Ctrl-D; started in the background, at once.
    """

    def watch() -> None:
        try:
            while os.read(0, 65536):
                pass  # nothing is ever sent; whatever is, is not ours to interpret
        except OSError:
            pass  # stdin closed or unreadable: the host is gone all the same
        os._exit(HOST_GONE_EXIT)

    threading.Thread(target=watch, name="host-watch", daemon=True).start()
