"""Operating-system data the simulated lab renders hosts from.

Base package sets are real image manifests (sources below), so a lab host's package
listing looks like a real node's: a few dozen ordinary packages around the NVIDIA ones.
The os-release texts are the distributions' own files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ubuntu:22.04 OCI root image manifest, `${binary:Package}\t${Version}` per line, verbatim from
# tianon/docker-brew-ubuntu-core jammy/ubuntu-jammy-oci-amd64-root.manifest
# (commit 570d5970a8b18bc772ad2c3eb1ce8fd0887d991a).
_JAMMY_BASE = """\
adduser	3.118ubuntu5
apt	2.4.6
base-files	12ubuntu4.2
base-passwd	3.5.52build1
bash	5.1-6ubuntu1
bsdutils	1:2.37.2-4ubuntu3
coreutils	8.32-4.1ubuntu1
dash	0.5.11+git20210903+057cd650a4ed-3build1
debconf	1.5.79ubuntu1
debianutils	5.5-1ubuntu2
diffutils	1:3.8-0ubuntu2
dpkg	1.21.1ubuntu2.1
e2fsprogs	1.46.5-2ubuntu1.1
findutils	4.8.0-1ubuntu3
gcc-12-base:amd64	12-20220319-1ubuntu1
gpgv	2.2.27-3ubuntu2.1
grep	3.7-1build1
gzip	1.10-4ubuntu4
hostname	3.23ubuntu2
init-system-helpers	1.62
libacl1:amd64	2.3.1-1
libapt-pkg6.0:amd64	2.4.6
libattr1:amd64	1:2.5.1-1build1
libaudit-common	1:3.0.7-1build1
libaudit1:amd64	1:3.0.7-1build1
libblkid1:amd64	2.37.2-4ubuntu3
libbz2-1.0:amd64	1.0.8-5build1
libc-bin	2.35-0ubuntu3.1
libc6:amd64	2.35-0ubuntu3.1
libcap-ng0:amd64	0.7.9-2.2build3
libcap2:amd64	1:2.44-1build3
libcom-err2:amd64	1.46.5-2ubuntu1.1
libcrypt1:amd64	1:4.4.27-1
libdb5.3:amd64	5.3.28+dfsg1-0.8ubuntu3
libdebconfclient0:amd64	0.261ubuntu1
libext2fs2:amd64	1.46.5-2ubuntu1.1
libffi8:amd64	3.4.2-4
libgcc-s1:amd64	12-20220319-1ubuntu1
libgcrypt20:amd64	1.9.4-3ubuntu3
libgmp10:amd64	2:6.2.1+dfsg-3ubuntu1
libgnutls30:amd64	3.7.3-4ubuntu1
libgpg-error0:amd64	1.43-3
libgssapi-krb5-2:amd64	1.19.2-2
libhogweed6:amd64	3.7.3-1build2
libidn2-0:amd64	2.3.2-2build1
libk5crypto3:amd64	1.19.2-2
libkeyutils1:amd64	1.6.1-2ubuntu3
libkrb5-3:amd64	1.19.2-2
libkrb5support0:amd64	1.19.2-2
liblz4-1:amd64	1.9.3-2build2
liblzma5:amd64	5.2.5-2ubuntu1
libmount1:amd64	2.37.2-4ubuntu3
libncurses6:amd64	6.3-2
libncursesw6:amd64	6.3-2
libnettle8:amd64	3.7.3-1build2
libnsl2:amd64	1.3.0-2build2
libp11-kit0:amd64	0.24.0-6build1
libpam-modules:amd64	1.4.0-11ubuntu2
libpam-modules-bin	1.4.0-11ubuntu2
libpam-runtime	1.4.0-11ubuntu2
libpam0g:amd64	1.4.0-11ubuntu2
libpcre2-8-0:amd64	10.39-3build1
libpcre3:amd64	2:8.39-13ubuntu0.22.04.1
libprocps8:amd64	2:3.3.17-6ubuntu2
libseccomp2:amd64	2.5.3-2ubuntu2
libselinux1:amd64	3.3-1build2
libsemanage-common	3.3-1build2
libsemanage2:amd64	3.3-1build2
libsepol2:amd64	3.3-1build1
libsmartcols1:amd64	2.37.2-4ubuntu3
libss2:amd64	1.46.5-2ubuntu1.1
libssl3:amd64	3.0.2-0ubuntu1.6
libstdc++6:amd64	12-20220319-1ubuntu1
libsystemd0:amd64	249.11-0ubuntu3.4
libtasn1-6:amd64	4.18.0-4build1
libtinfo6:amd64	6.3-2
libtirpc-common	1.3.2-2ubuntu0.1
libtirpc3:amd64	1.3.2-2ubuntu0.1
libudev1:amd64	249.11-0ubuntu3.4
libunistring2:amd64	1.0-1
libuuid1:amd64	2.37.2-4ubuntu3
libxxhash0:amd64	0.8.1-1
libzstd1:amd64	1.4.8+dfsg-3build1
login	1:4.8.1-2ubuntu2
logsave	1.46.5-2ubuntu1.1
lsb-base	11.1.0ubuntu4
mawk	1.3.4.20200120-3
mount	2.37.2-4ubuntu3
ncurses-base	6.3-2
ncurses-bin	6.3-2
passwd	1:4.8.1-2ubuntu2
perl-base	5.34.0-3ubuntu1
procps	2:3.3.17-6ubuntu2
sed	4.8-1ubuntu2
sensible-utils	0.0.17
sysvinit-utils	3.01-1ubuntu1
tar	1.34+dfsg-1build3
ubuntu-keyring	2021.03.26
usrmerge	25ubuntu2
util-linux	2.37.2-4ubuntu3
zlib1g:amd64	1:1.2.11.dfsg-2ubuntu9
"""

# ubuntu:24.04 package table from cybozu/ubuntu-base docs/ubuntu-24.04.md
# (commit 0176d49f657126ce966e069f1c0b39b66d795f76); name and version columns, a subset.
_NOBLE_BASE = """\
apt	2.8.3
base-files	13ubuntu10.3
base-passwd	3.6.3build1
bash	5.2.21-2ubuntu4
bsdutils	1:2.39.3-9ubuntu6.4
ca-certificates	20240203
coreutils	9.4-3ubuntu6.1
curl	8.5.0-2ubuntu10.6
dash	0.5.12-6ubuntu5
debconf	1.5.86ubuntu1
debianutils	5.17build1
diffutils	1:3.10-1build1
dpkg	1.22.6ubuntu6.5
e2fsprogs	1.47.0-2.4~exp1ubuntu4.1
findutils	4.9.0-5build1
gcc-14-base:amd64	14.2.0-4ubuntu2~24.04
gpgv	2.4.4-2ubuntu17.4
grep	3.11-4build1
gzip	1.12-1ubuntu3.1
hostname	3.23+nmu2ubuntu2
init-system-helpers	1.66ubuntu1
libacl1:amd64	2.3.2-1build1.1
libapt-pkg6.0t64:amd64	2.8.3
libattr1:amd64	1:2.5.2-1build1.1
libaudit-common	1:3.1.2-2.1build1.1
libaudit1:amd64	1:3.1.2-2.1build1.1
libblkid1:amd64	2.39.3-9ubuntu6.4
libbz2-1.0:amd64	1.0.8-5.1build0.1
libc-bin	2.39-0ubuntu8.6
libc6:amd64	2.39-0ubuntu8.6
libcap2:amd64	1:2.66-5ubuntu2.2
libcrypt1:amd64	1:4.4.36-4build1
libgcc-s1:amd64	14.2.0-4ubuntu2~24.04
libgnutls30t64:amd64	3.8.3-1.1ubuntu3.4
liblzma5:amd64	5.6.1+really5.4.5-1ubuntu0.2
libmount1:amd64	2.39.3-9ubuntu6.4
libpam-modules:amd64	1.5.3-5ubuntu5.5
libpam-runtime	1.5.3-5ubuntu5.5
libpam0g:amd64	1.5.3-5ubuntu5.5
libselinux1:amd64	3.5-2ubuntu2.1
libssl3t64:amd64	3.0.13-0ubuntu3.7
libstdc++6:amd64	14.2.0-4ubuntu2~24.04
libsystemd0:amd64	255.4-1ubuntu8.12
libudev1:amd64	255.4-1ubuntu8.12
libzstd1:amd64	1.5.5+dfsg2-2build1.1
login	1:4.13+dfsg1-4ubuntu3.2
mawk	1.3.4.20240123-1build1
mount	2.39.3-9ubuntu6.4
ncurses-base	6.4+20240113-1ubuntu2
ncurses-bin	6.4+20240113-1ubuntu2
openssl	3.0.13-0ubuntu3.7
passwd	1:4.13+dfsg1-4ubuntu3.2
perl-base	5.38.2-3.2ubuntu0.2
procps	2:4.0.4-4ubuntu3.2
sed	4.9-2build1
sensible-utils	0.0.22
sysvinit-utils	3.08-6ubuntu3
tar	1.35+dfsg-3build1
tzdata	2025b-0ubuntu0.24.04.1
ubuntu-keyring	2023.11.28.1
util-linux	2.39.3-9ubuntu6.4
zlib1g:amd64	1:1.3.dfsg-3.1ubuntu2.1
"""

# almalinux:9-minimal (a RHEL 9 rebuild) rpm list from docker-library/repo-info
# repos/almalinux/local/9-minimal.md (commit f51cff1b0151f810a6e7b8592db3435acd170809),
# NAME-VERSION-RELEASE.ARCH split into `%{NAME}\t%{VERSION}-%{RELEASE}\t%{ARCH}`; a subset.
_EL9_BASE = """\
almalinux-gpg-keys	9.8-1.el9	x86_64
almalinux-release	9.8-1.el9	x86_64
alternatives	1.24-2.el9	x86_64
audit-libs	3.1.5-8.el9	x86_64
basesystem	11-13.el9	noarch
bash	5.1.8-9.el9	x86_64
bzip2-libs	1.0.8-11.el9	x86_64
ca-certificates	2025.2.80_v9.0.305-91.el9	noarch
coreutils-single	8.32-41.el9_8	x86_64
crypto-policies	20260224-1.gitea0f072.el9_8	noarch
curl-minimal	7.76.1-40.el9_8.5	x86_64
cyrus-sasl-lib	2.1.27-22.el9	x86_64
dnf-data	4.14.0-34.el9_8.alma.1	noarch
file-libs	5.39-17.el9	x86_64
filesystem	3.16-5.el9	x86_64
findutils	4.8.0-7.el9	x86_64
gawk	5.1.0-6.el9	x86_64
gdbm-libs	1.23-1.el9	x86_64
glib2	2.68.4-19.el9_8.9	x86_64
glibc	2.34-275.el9_8	x86_64
glibc-common	2.34-275.el9_8	x86_64
glibc-minimal-langpack	2.34-275.el9_8	x86_64
gmp	6.2.0-13.el9	x86_64
gnupg2	2.3.3-5.el9_7	x86_64
gnutls	3.8.10-8.el9_8	x86_64
grep	3.6-5.el9	x86_64
json-c	0.14-11.el9	x86_64
keyutils-libs	1.6.3-1.el9	x86_64
krb5-libs	1.21.1-10.el9_8	x86_64
libacl	2.4.0-1.el9_8	x86_64
libattr	2.6.0-1.el9_8	x86_64
libblkid	2.37.4-25.el9	x86_64
libcap	2.48-10.el9_8.1	x86_64
libcap-ng	0.8.2-7.el9	x86_64
libcom_err	1.46.5-8.el9	x86_64
libdnf	0.69.0-18.el9.alma.1	x86_64
libffi	3.4.2-8.el9	x86_64
libgcc	11.5.0-14.el9.alma.1	x86_64
libmount	2.37.4-25.el9	x86_64
libselinux	3.6-3.el9	x86_64
libsepol	3.6-3.el9	x86_64
libsmartcols	2.37.4-25.el9	x86_64
libstdc++	11.5.0-14.el9.alma.1	x86_64
libuuid	2.37.4-25.el9	x86_64
libxcrypt	4.4.18-3.el9	x86_64
libzstd	1.5.5-1.el9	x86_64
lz4-libs	1.9.3-5.el9	x86_64
ncurses-base	6.2-12.20210508.el9	noarch
ncurses-libs	6.2-12.20210508.el9	x86_64
openssl-libs	3.5.5-6.el9_8	x86_64
pcre2	10.40-6.el9	x86_64
readline	8.1-4.el9	x86_64
rpm	4.16.1.3-40.el9	x86_64
rpm-libs	4.16.1.3-40.el9	x86_64
sed	4.8-10.el9	x86_64
setup	2.13.7-10.el9	noarch
shadow-utils	4.9-16.el9	x86_64
sqlite-libs	3.34.1-11.el9_8	x86_64
systemd-libs	252-67.el9_8.4.alma.1	x86_64
tzdata	2026c-1.el9_8	noarch
xz-libs	5.2.5-8.el9_0	x86_64
zlib	1.2.11-40.el9	x86_64
"""

_UBUNTU_2204_RELEASE = """\
PRETTY_NAME="Ubuntu 22.04.5 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.5 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=jammy
"""

_UBUNTU_2404_RELEASE = """\
PRETTY_NAME="Ubuntu 24.04.2 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.2 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""

_RHEL9_RELEASE = """\
NAME="Red Hat Enterprise Linux"
VERSION="9.4 (Plow)"
ID="rhel"
ID_LIKE="fedora"
VERSION_ID="9.4"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Red Hat Enterprise Linux 9.4 (Plow)"
ANSI_COLOR="0;31"
LOGO="fedora-logo-icon"
CPE_NAME="cpe:/o:redhat:enterprise_linux:9::baseos"
HOME_URL="https://www.redhat.com/"
DOCUMENTATION_URL="https://access.redhat.com/documentation/en-us/red_hat_enterprise_linux/9"
BUG_REPORT_URL="https://bugzilla.redhat.com/"
REDHAT_BUGZILLA_PRODUCT="Red Hat Enterprise Linux 9"
REDHAT_BUGZILLA_PRODUCT_VERSION=9.4
REDHAT_SUPPORT_PRODUCT="Red Hat Enterprise Linux"
REDHAT_SUPPORT_PRODUCT_VERSION="9.4"
"""


@dataclass(frozen=True)
class OsInfo:
    """What differs between the distributions a lab host can run."""

    name: str
    family: str  # debian or redhat
    manager: str  # dpkg or rpm
    os_release: str
    default_kernel: str
    # dkms 2.x (Ubuntu 22.04) prints "name, version, kernel, arch: state";
    # dkms 3.x prints "name/version, kernel, arch: state".
    dkms_slash_format: bool
    # The distribution's own package version suffix for NVIDIA driver packages.
    driver_pkg_suffix: str
    base: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    # Packages a GPU node carries beyond the minimal image (name, version[, arch]).
    platform: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    unattended_package: tuple[str, ...] = ()


def _rows(text: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(line.split("\t")) for line in text.splitlines() if line)


def kernel_package_rows(os_info: OsInfo, kernel: str) -> list[tuple[str, ...]]:
    """The installed packages of the running kernel, named as the distribution names them."""
    if os_info.manager == "rpm":
        # 5.14.0-427.13.1.el9_4.x86_64 -> version 5.14.0, release 427.13.1.el9_4
        base, _, arch = kernel.rpartition(".")
        version, _, release = base.partition("-")
        vr = f"{version}-{release}"
        return [("kernel", vr, arch), ("kernel-core", vr, arch), ("kernel-modules", vr, arch),
                ("kernel-devel", vr, arch)]
    # 5.15.0-139-generic -> package version 5.15.0-139.<upload>; the upload number is not in the
    # release string, so the ABI number stands in for it.
    abi = kernel.rsplit("-", 1)[0]
    pkg_version = f"{abi}.{abi.rsplit('-', 1)[-1]}"
    return [(f"linux-image-{kernel}", pkg_version), (f"linux-modules-{kernel}", pkg_version),
            (f"linux-headers-{kernel}", pkg_version)]


OS_INFO: dict[str, OsInfo] = {
    "ubuntu-22.04": OsInfo(
        name="ubuntu-22.04", family="debian", manager="dpkg", os_release=_UBUNTU_2204_RELEASE,
        default_kernel="5.15.0-139-generic", dkms_slash_format=False,
        driver_pkg_suffix="-0ubuntu0.22.04.1", base=_rows(_JAMMY_BASE),
        platform=(("openssh-server", "1:8.9p1-3ubuntu0.13"), ("python3", "3.10.6-1~22.04.1"),
                  ("systemd", "249.11-0ubuntu3.16"), ("kmod", "29-1ubuntu1"), ("pciutils", "1:3.7.0-6"),
                  ("rdma-core", "39.0-1"), ("ibverbs-providers:amd64", "39.0-1"),
                  ("infiniband-diags", "39.0-1")),
        unattended_package=("unattended-upgrades", "2.8ubuntu1"),
    ),
    "ubuntu-24.04": OsInfo(
        name="ubuntu-24.04", family="debian", manager="dpkg", os_release=_UBUNTU_2404_RELEASE,
        default_kernel="6.8.0-60-generic", dkms_slash_format=True,
        driver_pkg_suffix="-0ubuntu0.24.04.1", base=_rows(_NOBLE_BASE),
        platform=(("openssh-server", "1:9.6p1-3ubuntu13.11"), ("python3", "3.12.3-0ubuntu2"),
                  ("systemd", "255.4-1ubuntu8.6"), ("kmod", "31+20240202-2ubuntu7"),
                  ("pciutils", "1:3.10.0-2build1"), ("rdma-core", "50.0-2build2"),
                  ("ibverbs-providers:amd64", "50.0-2build2"), ("infiniband-diags", "50.0-2build2")),
        unattended_package=("unattended-upgrades", "2.9.1+nmu4ubuntu1"),
    ),
    "rhel-9": OsInfo(
        name="rhel-9", family="redhat", manager="rpm", os_release=_RHEL9_RELEASE,
        default_kernel="5.14.0-427.13.1.el9_4.x86_64", dkms_slash_format=True,
        driver_pkg_suffix="-1.el9", base=_rows(_EL9_BASE),
        platform=(("openssh-server", "8.7p1-38.el9", "x86_64"), ("python3", "3.9.18-3.el9", "x86_64"),
                  ("systemd", "252-32.el9_4", "x86_64"), ("kmod", "28-9.el9", "x86_64"),
                  ("pciutils", "3.7.0-5.el9", "x86_64"), ("rdma-core", "48.0-1.el9", "x86_64"),
                  ("libibverbs", "48.0-1.el9", "x86_64"), ("infiniband-diags", "48.0-1.el9", "x86_64")),
        unattended_package=("dnf-automatic", "4.14.0-9.el9", "noarch"),
    ),
}
