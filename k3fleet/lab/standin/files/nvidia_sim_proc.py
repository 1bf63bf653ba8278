#!/usr/bin/python3
"""Writes the simulated /proc view of the stand-in NVIDIA driver (k3fleet testbed).

Installed as /usr/lib/nvidia-sim/nvidia-sim-proc and run by two oneshot units at boot:

  base   (nvidia-sim-proc.service, package nvidia-sim-hardware): the parts of /proc that
         exist with or without a driver: a copy of /proc/modules and the kernel release.
  load   (nvidia-sim-load.service, package nvidia-kernel-sim-<branch>): "loads the kernel
         module" of the INSTALLED package: adds the nvidia modules, the NVSwitch devices
         and, last, driver/nvidia/version, so a reader never sees a half-loaded driver.

Both also write the simulated kernel log (/run/nvidia-sim/kmsg) that the stand-in dmesg prints:
the kernel banner at base, the driver's "NVRM: loading" line at load.

Because both run only at boot and /run is a tmpfs, installing or removing driver
packages changes the loaded driver only after a reboot, as with real kernel modules.
"""

import os
import sys
import tempfile

PROC = os.environ.get("NVIDIA_SIM_PROC", "/run/nvidia-sim/proc")
HOST_PROC = os.environ.get("NVIDIA_SIM_HOST_PROC", "/proc")
GPUS_CONF = os.environ.get("NVIDIA_SIM_GPUS_CONF", "/etc/nvidia-sim/gpus.conf")
MODULE_CONF = os.environ.get("NVIDIA_SIM_MODULE_CONF", "/usr/lib/nvidia-sim/kernel-module.conf")
# The simulated kernel log the stand-in dmesg prints (a guest cannot read the machine's ring buffer).
KMSG = os.environ.get("NVIDIA_SIM_KMSG", "/run/nvidia-sim/kmsg")

# First line of /proc/driver/nvidia/version per flavour (docs/facts.md section 5). The open
# form inserts "for x86_64" and the builder: a parser taking "the token after Module" breaks.
VERSION_LINE = {
    "proprietary": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {build_date}",
    "open": ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build"
             "  ({builder})  {build_date}"),
}
# Module sizes are illustrative; the taint flags are real: the proprietary module taints
# the kernel as proprietary (P), the dual MIT/GPL open module does not.
MODULES = {
    "proprietary": {"taint": "(POE)", "nvidia": 104857600, "nvidia_modeset": 1638400,
                    "nvidia_uvm": 4964352},
    "open": {"taint": "(OE)", "nvidia": 14376960, "nvidia_modeset": 1597440,
             "nvidia_uvm": 4964352},
}


def read_conf(path):
    """key=value lines; '#' starts a comment line."""
    conf = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, value = line.split("=", 1)
            conf[key.strip()] = value.strip()
    return conf


def write_atomic(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)


def host_modules():
    """The host's module list without any nvidia line: the simulated driver adds its own."""
    try:
        with open(os.path.join(HOST_PROC, "modules"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    return [line for line in lines if not line.split(" ", 1)[0].startswith("nvidia")]


def uptime():
    """Seconds since the kernel booted: the stamp dmesg puts on each line."""
    try:
        with open(os.path.join(HOST_PROC, "uptime"), encoding="utf-8") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def kernel_line(seconds, text):
    """One line as dmesg prints the ring buffer: "[    5.812337] text"."""
    return f"[{seconds:12.6f}] {text}\n"


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def base():
    try:
        with open(os.path.join(HOST_PROC, "sys/kernel/osrelease"), encoding="utf-8") as handle:
            release = handle.read().strip()
    except OSError as exc:
        print(f"nvidia-sim-proc: cannot read the kernel release from {HOST_PROC}: {exc}",
              file=sys.stderr)
        return 1
    write_atomic(os.path.join(PROC, "sys/kernel/osrelease"), release + "\n")
    write_atomic(os.path.join(PROC, "modules"), "".join(line + "\n" for line in host_modules()))
    # The ring buffer starts with the kernel's banner, which is /proc/version's text.
    banner = read_text(os.path.join(HOST_PROC, "version")).strip() or f"Linux version {release}"
    write_atomic(KMSG, kernel_line(0.0, banner))
    return 0


def load():
    try:
        module = read_conf(MODULE_CONF)
        version, flavour = module["version"], module["flavour"]
    except (OSError, KeyError) as exc:
        print(f"nvidia-sim-proc: no loadable module description in {MODULE_CONF}: {exc}",
              file=sys.stderr)
        return 1
    if flavour not in VERSION_LINE:
        print(f"nvidia-sim-proc: unknown module flavour {flavour!r} in {MODULE_CONF}", file=sys.stderr)
        return 1
    try:
        gpus = read_conf(GPUS_CONF)
    except OSError:
        gpus = {}
    if not os.path.exists(os.path.join(PROC, "sys/kernel/osrelease")):
        rc = base()
        if rc:
            return rc

    sizes = MODULES[flavour]
    taint = sizes["taint"]
    # Newest module first, as /proc/modules lists them; nvidia is held by the other two.
    nvidia_lines = [
        f"nvidia_uvm {sizes['nvidia_uvm']} 0 - Live 0x0000000000000000 {taint}",
        f"nvidia_modeset {sizes['nvidia_modeset']} 0 - Live 0x0000000000000000 {taint}",
        f"nvidia {sizes['nvidia']} 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 {taint}",
    ]
    write_atomic(os.path.join(PROC, "modules"),
                 "".join(line + "\n" for line in nvidia_lines + host_modules()))

    switch_dir = os.path.join(PROC, "driver/nvidia-nvswitch")
    switches = [b.strip() for b in gpus.get("nvswitch_bus_ids", "").split(",") if b.strip()]
    if switches:
        write_atomic(os.path.join(switch_dir, "permissions"), "DeviceFileMode: 438\n")
        for bdf in switches:
            # The real driver prints N/A when it could not read the switch BIOS version.
            write_atomic(os.path.join(switch_dir, "devices", bdf, "information"), "BIOS Version: N/A\n")

    first = VERSION_LINE[flavour].format(version=version, build_date=module.get("build_date", ""),
                                         builder=module.get("builder", "dvs-builder@localhost"))
    gcc = "GCC version:  {}\n".format(module.get("gcc", "gcc version 12.2.0 (Debian 12.2.0-14)"))
    write_atomic(os.path.join(PROC, "driver/nvidia/version"), first + "\n" + gcc)
    # What the real module logs as it loads (docs/facts.md section 5): "NVRM: loading" and the
    # version line's text; a healthy node logs no Xid after it.
    loading = kernel_line(uptime(), "NVRM: loading " + first[len("NVRM version: "):])
    write_atomic(KMSG, read_text(KMSG) + loading)
    return 0


def main(argv):
    if len(argv) != 2 or argv[1] not in ("base", "load"):
        print("usage: nvidia-sim-proc base|load", file=sys.stderr)
        return 2
    return base() if argv[1] == "base" else load()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
