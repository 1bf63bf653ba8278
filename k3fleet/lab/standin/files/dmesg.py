#!/usr/bin/python3
"""Stand-in dmesg for the k3fleet testbed (package nvidia-sim-hardware, diverting util-linux's).

A guest's real kernel ring buffer is the machine's (and systemd-nspawn refuses it without
CAP_SYSLOG), so the simulated hardware keeps a kernel log of its own: nvidia-sim-proc writes the
kernel's version line at boot and the driver's "NVRM: loading" line when it "loads the kernel
module". This prints that log as util-linux dmesg prints the ring buffer with no options:
"[seconds.micros] text" per line. Xid lines appear only when something writes them, as on a
healthy node.
"""

import os
import signal
import sys

KMSG = os.environ.get("NVIDIA_SIM_KMSG", "/run/nvidia-sim/kmsg")


def main(argv):
    if argv:
        # util-linux's wording for an option it does not know; the collector passes none.
        print(f"dmesg: unrecognized option '{argv[0]}'", file=sys.stderr)
        print("Try 'dmesg --help' for more information.", file=sys.stderr)
        return 1
    try:
        with open(KMSG, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        print(f"dmesg: read kernel buffer failed: {exc.strerror}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
