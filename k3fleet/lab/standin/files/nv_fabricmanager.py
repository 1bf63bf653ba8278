#!/usr/bin/python3
"""Stand-in nv-fabricmanager for the k3fleet testbed (package nvidia-fabricmanager-<branch>).

Like the real daemon it refuses to start unless its version equals the LOADED driver
version exactly, and fails when it finds no NVSwitch to configure. While it runs, the
GPUs' fabric state reads "completed" through the stand-in NVML: it records its pid in a
state file that libnvidia-ml.so.1 checks, and removes the file when it stops.

It stays in the foreground (systemd Type=notify): systemctl start fails when it does.
"""

import os
import signal
import socket
import sys
import tempfile

FM_VERSION = "@FM_VERSION@"
# Set by the repository builder for a deliberately broken build (rollback tests).
SIM_FAULT = "@SIM_FAULT@"

PROC = os.environ.get("NVIDIA_SIM_PROC", "/run/nvidia-sim/proc")
STATE = os.environ.get("NVIDIA_SIM_FABRIC_STATE", "/run/nvidia-sim/fabricmanager.state")

# Journal lines of the real daemon (reference notes of the stand-in).
MSG_MISMATCH = ("fabric manager NVIDIA GPU driver interface version {fm} don't match with driver "
                "version {driver}. Please update with matching NVIDIA driver package.")
MSG_NO_SWITCH = ("request to query NVSwitch device information from NVSwitch driver failed with "
                 "error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]")
MSG_NOT_LOADED = "fabric manager failed to open the NVIDIA GPU driver: the nvidia kernel module is not loaded"
MSG_READY = ("Successfully configured all the available NVSwitches to route GPU NVLink traffic. "
             "NVLink Peer-to-Peer support will be enabled once the GPUs are successfully registered "
             "with the NVLink fabric.")


def log(message):
    print(message, file=sys.stderr, flush=True)


def loaded_driver_version():
    """Version of the loaded module, or None. The open flavour has 'for x86_64' after 'Module'."""
    try:
        with open(os.path.join(PROC, "driver/nvidia/version"), encoding="utf-8") as handle:
            first = handle.readline()
    except OSError:
        return None
    tokens = first.split()
    if "Module" not in tokens:
        return None
    for token in tokens[tokens.index("Module") + 1:]:
        parts = token.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return token
    return None


def nvswitches():
    path = os.path.join(PROC, "driver/nvidia-nvswitch/devices")
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def notify(message):
    """sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


def write_state():
    os.makedirs(os.path.dirname(STATE), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(STATE), prefix=".fm-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"pid={os.getpid()}\nversion={FM_VERSION}\nstate=completed\n")
    os.replace(tmp, STATE)


def remove_state():
    try:
        with open(STATE, encoding="utf-8") as handle:
            mine = f"pid={os.getpid()}\n" in handle.read()
        if mine:
            os.unlink(STATE)
    except OSError:
        pass


def start():
    driver = loaded_driver_version()
    if driver is None:
        log(MSG_NOT_LOADED)
        return 1
    if driver != FM_VERSION:
        log(MSG_MISMATCH.format(fm=FM_VERSION, driver=driver))
        return 1
    if SIM_FAULT or not nvswitches():
        log(MSG_NO_SWITCH)
        return 1

    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    write_state()
    try:
        log(MSG_READY)
        notify("READY=1")
        while not stopping:
            signal.pause()
    finally:
        remove_state()
    return 0


def main(argv):
    args = argv[1:]
    if any(a in ("-v", "--version") for a in args):
        print(f"Fabric Manager version is : {FM_VERSION}")
        return 0
    config = None
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            config = args[i + 1]
    if config is not None and not os.path.isfile(config):
        log(f"fabric manager failed to open config file {config}")
        return 1
    return start()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
