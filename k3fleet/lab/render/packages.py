"""The installed packages as dpkg-query or rpm lists them, and the package manager's own settings."""

from __future__ import annotations

from k3fleet.lab.osdata import kernel_package_rows
from k3fleet.lab.render.node import Part, lines_text


class PackageView(Part):
    """The package database of the node: the distribution's base, the kernel, NVIDIA's and the runtime's."""

    def apt_auto_upgrades(self) -> str | None:
        u = self.p.unattended_upgrades
        if self.os.family != "debian" or not u.installed:
            return None
        flag = "1" if u.enabled else "0"
        return f'APT::Periodic::Update-Package-Lists "{flag}";\nAPT::Periodic::Unattended-Upgrade "{flag}";\n'

    def dnf_versionlock(self) -> str | None:
        if self.os.family != "redhat":
            return None
        held = [row for row, is_held in self._rows() if is_held]
        if not held:
            return None
        # versionlock.list entries are NEVRA globs with the epoch; NVIDIA's RPMs carry epoch 3.
        lines = []
        for name, vr, *_arch in held:
            epoch = "3" if name.startswith(("nvidia-", "kmod-nvidia", "cuda-drivers")) else "0"
            lines.append(f"{name}-{epoch}:{vr}.*")
        return lines_text(lines)

    def dpkg_query(self) -> str:
        rows = sorted(self._rows(), key=lambda r: r[0][0])
        # ${db:Status-Abbrev} is three characters: want, status, error flag ("ii ", "hi ").
        return "".join(f"{n}\t{v}\t{'h' if held else 'i'}i \n" for (n, v), held in rows)

    def rpm_query(self) -> str:
        # rpm -qa lists in database order, not sorted; keep insertion order.
        return "".join(f"{n}\t{vr}\t{a}\n" for (n, vr, a), _held in self._rows())

    def _rows(self) -> list[tuple[tuple[str, ...], bool]]:
        """Every installed package in database order: (name, version) and, for rpm, the arch; and held or not."""
        rpm = self.os.manager == "rpm"
        width = 3 if rpm else 2
        arch = ("x86_64",) if rpm else ()
        rows = [(tuple(r[:width]), False)
                for r in (*self.os.base, *self.os.platform, *kernel_package_rows(self.os, self.kernel))]
        if self.p.unattended_upgrades.installed and self.os.unattended_package:
            rows.append((tuple(self.os.unattended_package[:width]), False))
        rows += [((n, v, *arch), self._held(n, role)) for n, v, role in self._driver_packages()]
        rows += [((n, v, *arch), self._held(n, "other")) for n, v in self._other_packages()]
        return rows

    def _driver_packages(self) -> list[tuple[str, str, str]]:
        """(name, version, role) of the installed NVIDIA packages, named as the distribution does."""
        out: list[tuple[str, str, str]] = []
        drv = self.drv
        fm_version = self.p.fabricmanager_version
        if drv is not None and self.os.manager == "dpkg":
            b, ver = drv.branch, drv.version + self.os.driver_pkg_suffix
            open_ = "-open" if drv.flavour == "open" else ""
            out += [(f"nvidia-driver-{b}-server{open_}", ver, "driver"),
                    (f"nvidia-utils-{b}-server", ver, "driver"),
                    (f"nvidia-compute-utils-{b}-server", ver, "driver"),
                    (f"nvidia-kernel-common-{b}-server", ver, "driver"),
                    (f"libnvidia-compute-{b}:amd64", ver, "driver")]
            if drv.dkms:
                out += [(f"nvidia-dkms-{b}-server{open_}", ver, "driver"),
                        (f"nvidia-kernel-source-{b}-server{open_}", ver, "driver")]
            else:
                out.append((f"linux-modules-nvidia-{b}-server{open_}-{self.kernel}",
                            f"{self.kernel.rsplit('-', 1)[0]}+{drv.version}", "driver"))
        elif drv is not None:
            ver = drv.version + self.os.driver_pkg_suffix
            kmod = ("kmod-nvidia-open-dkms" if drv.flavour == "open" else "kmod-nvidia-latest-dkms") \
                if drv.dkms else f"kmod-nvidia-{drv.version}-{self.kernel.rsplit('.', 1)[0]}"
            out += [("nvidia-driver", ver, "driver"), ("nvidia-driver-cuda", ver, "driver"),
                    ("nvidia-driver-libs", ver, "driver"), ("nvidia-driver-cuda-libs", ver, "driver"),
                    ("nvidia-kmod-common", ver, "driver"), ("nvidia-persistenced", ver, "driver"),
                    (kmod, ver, "driver")]
        if fm_version is not None:
            fb = fm_version.split(".", 1)[0]
            out += [(f"nvidia-fabricmanager-{fb}", f"{fm_version}-1", "fabricmanager"),
                    (f"cuda-drivers-fabricmanager-{fb}", f"{fm_version}-1", "fabricmanager")]
        return out

    def _other_packages(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        c = self.p.container
        rpm = self.os.manager == "rpm"
        if c.toolkit_version:
            tk = f"{c.toolkit_version}-1"
            out += [("nvidia-container-toolkit", tk), ("nvidia-container-toolkit-base", tk),
                    ("libnvidia-container-tools", tk),
                    ("libnvidia-container1" if rpm else "libnvidia-container1:amd64", tk)]
        if self.runtime == "docker":
            dist = "el9" if rpm else f"ubuntu.{self.p.os.split('-')[1]}~{self._codename()}"
            sep = "." if rpm else "~"
            out += [("docker-ce", f"{'' if rpm else '5:'}{c.runtime_version}-1{sep}{dist}"),
                    ("docker-ce-cli", f"{'' if rpm else '5:'}{c.runtime_version}-1{sep}{dist}"),
                    ("containerd.io", "1.7.27-1" if not rpm else "1.7.27-3.1.el9")]
        elif self.runtime == "podman":
            out.append(("podman", f"{c.runtime_version}-1" if rpm else f"{c.runtime_version}+ds1-1ubuntu1"))
        out += sorted(self.p.compat_packages.items())
        if self.drv is not None and self.drv.dkms:
            out.append(("dkms", "3.1.6-1.el9" if rpm else
                        ("2.8.7-2ubuntu2.2" if self.p.os == "ubuntu-22.04" else "3.0.11-1ubuntu13")))
        return out

    def _codename(self) -> str:
        return {"ubuntu-22.04": "jammy", "ubuntu-24.04": "noble"}.get(self.p.os, "")

    def _held(self, name: str, role: str) -> bool:
        bare = name.split(":", 1)[0]
        if bare in self.p.held_packages or name in self.p.held_packages:
            return True
        if role == "driver" and self.drv is not None:
            return self.drv.held
        if role == "fabricmanager":
            return self.p.fabricmanager.held
        return False

