"""The container side of the node: the toolkit and runtime versions, the serving image's inspect, the
other tenants' containers and the GPU processes' cgroups and maps (docs/facts.md sections 8 and 16)."""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_image import parse_image_ref
from k3fleet.lab.render.node import HostImage, Part, Recording, hex_of


class ContainerView(Part):
    """What docker or podman and the NVIDIA Container Toolkit answer on this node."""

    def nvidia_ctk_version(self) -> Recording:
        c = self.p.container
        out = f"NVIDIA Container Toolkit CLI version {c.toolkit_version}\n"
        if c.toolkit_commit:
            out += f"commit: {c.toolkit_commit}\n"
        return Recording(stdout=out)

    def runtime_version(self) -> Recording:
        c = self.p.container
        if self.runtime == "docker":
            build = f", build {c.runtime_build}" if c.runtime_build else ""
            return Recording(stdout=f"Docker version {c.runtime_version}{build}\n")
        return Recording(stdout=f"podman version {c.runtime_version}\n")

    def image_ids(self) -> tuple[str, str]:
        spec = self.p.container.image
        digest = (spec.digest or hex_of(f"digest/{self.image}")).removeprefix("sha256:")
        image_id = (spec.id or hex_of(f"id/{self.image}/{spec.cuda_version}")).removeprefix("sha256:")
        return digest, image_id

    def image_env(self) -> list[str]:
        spec = self.p.container.image
        # The nvidia/cuda base image's variables, then vLLM's, then the profile's own.
        env = {
            "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin",
            "NVARCH": "x86_64",
            "NVIDIA_REQUIRE_CUDA": spec.nvidia_require_cuda,
            "CUDA_VERSION": spec.cuda_version,
            "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
            "UV_HTTP_TIMEOUT": "500",
            "VLLM_USAGE_SOURCE": "production-docker-image",
        }
        env.update(spec.env)
        return [f"{k}={v}" for k, v in env.items()]

    def image_labels(self) -> dict[str, str]:
        spec = self.p.container.image
        # The Ubuntu base image's OCI labels; a release pipeline that tags the image with its
        # vLLM version overwrites org.opencontainers.image.version with it.
        labels = {"maintainer": "NVIDIA CORPORATION <cudatools@nvidia.com>",
                  "org.opencontainers.image.ref.name": "ubuntu",
                  "org.opencontainers.image.version": "22.04"}
        if spec.vllm_version:
            labels.update({"org.opencontainers.image.source": "https://github.com/vllm-project/vllm",
                           "org.opencontainers.image.title": "vllm-openai",
                           "org.opencontainers.image.version": spec.vllm_version})
        labels.update(spec.labels)
        return labels

    def image_inspect(self) -> Recording:
        spec = self.p.container.image
        ref = parse_image_ref(self.image)
        by_digest = ref.digest is not None
        repo = ref.written
        if not spec.present:
            if self.runtime == "docker":
                return Recording(stdout="[]\n", stderr=f"Error response from daemon: No such image: {self.image}\n",
                                 rc=1)
            return Recording(stdout="[]\n", stderr=f"Error: {self.image}: image not known\n", rc=125)
        digest, image_id = self.image_ids()
        if by_digest:
            # Pulled by digest: the reference names the digest, and the image has no tag.
            digest = (ref.digest or "").split(":", 1)[-1]
        tags = [] if by_digest else [self.image]
        layers = [f"sha256:{hex_of(f'layer/{self.image}/{i}')}" for i in range(4)]
        if self.runtime == "docker":
            doc: dict[str, Any] = {
                "Id": f"sha256:{image_id}",
                "RepoTags": tags,
                "RepoDigests": [f"{repo}@sha256:{digest}"],
                "Parent": "",
                "Comment": "buildkit.dockerfile.v0",
                "Created": spec.created,
                "DockerVersion": "",
                "Author": "",
                "Config": {
                    "Hostname": "", "Domainname": "", "User": "", "AttachStdin": False,
                    "AttachStdout": False, "AttachStderr": False, "Tty": False, "OpenStdin": False,
                    "StdinOnce": False, "Env": self.image_env(), "Cmd": None, "Image": "",
                    "Volumes": None, "WorkingDir": "/vllm-workspace",
                    "Entrypoint": ["vllm", "serve"], "OnBuild": None, "Labels": self.image_labels(),
                },
                "Architecture": "amd64",
                "Os": "linux",
                "Size": 21474836480,
                "GraphDriver": {"Data": None, "Name": "overlayfs"},
                "RootFS": {"Type": "layers", "Layers": layers},
                "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
            }
        else:
            doc = {
                "Id": image_id,
                "Digest": f"sha256:{digest}",
                # podman names images fully qualified.
                "RepoTags": [ref.repository + (f":{ref.tag}" if ref.tag else "")] if tags else [],
                "RepoDigests": [f"{repo}@sha256:{digest}"],
                "Parent": "",
                "Comment": "buildkit.dockerfile.v0",
                "Created": spec.created,
                "Config": {"Env": self.image_env(), "Entrypoint": ["vllm", "serve"],
                           "WorkingDir": "/vllm-workspace", "Labels": self.image_labels()},
                "Version": "",
                "Author": "",
                "Architecture": "amd64",
                "Os": "linux",
                "Size": 21474836480,
                "VirtualSize": 21474836480,
                "GraphDriver": {"Name": "overlay", "Data": {}},
                "RootFS": {"Type": "layers", "Layers": layers},
                "Labels": self.image_labels(),
                "Annotations": {},
                "ManifestType": "application/vnd.oci.image.manifest.v1+json",
                "User": "",
                "History": [],
                "NamesHistory": tags,
            }
        return Recording(stdout=json.dumps([doc], indent=4) + "\n")


    def tenant_id(self, name: str) -> str:
        return hex_of(f"tenant/{name}")

    def render_tenants(self, img: HostImage) -> None:
        tenants = self.p.container.tenants
        ids = [self.tenant_id(t.name) for t in tenants]
        img.record(sources.container_ps_argv(self.runtime), Recording(stdout="".join(f"{i}\n" for i in ids)))
        if not tenants:
            return
        out = []
        for t, ident in zip(tenants, ids, strict=True):
            env = {"PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                           "/usr/bin:/sbin:/bin", "NVARCH": "x86_64", "LD_LIBRARY_PATH": t.ld_library_path,
                   "NVIDIA_VISIBLE_DEVICES": "all" if t.gpus else "void"}
            if t.nvidia_require_cuda:
                env["NVIDIA_REQUIRE_CUDA"] = t.nvidia_require_cuda
            if t.cuda_version:
                env["CUDA_VERSION"] = t.cuda_version
            if t.compat_package:
                env["NV_CUDA_COMPAT_PACKAGE"] = t.compat_package
            requests = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                         "Options": {}}] if t.gpus else None
            # The fields docker 28's inspect gives that the collector reads, in its shape.
            out.append({"Id": ident, "Name": f"/{t.name}", "Image": "sha256:" + hex_of(f"tenant-image/{t.image}"),
                        "State": {"Status": "running", "Running": True, "Pid": t.pids[0] if t.pids else 4000},
                        "HostConfig": {"Runtime": "runc", "DeviceRequests": requests},
                        "Config": {"Image": t.image, "Env": [f"{k}={v}" for k, v in env.items()]}})
        img.record(sources.container_inspect_argv(self.runtime, ids),
                   Recording(stdout=json.dumps(out, indent=4) + "\n"))

    def render_process_maps(self, img: HostImage) -> None:
        """/proc/<pid>/cgroup and maps of each GPU process: its container (a tenant's) and its libcuda."""
        owner = {pid: self.tenant_id(t.name) for t in self.p.container.tenants for pid in t.pids}
        version = (self.drv.loaded_version or self.drv.version) if self.drv is not None else None
        for proc in self.p.gpus.processes:
            cid = owner.get(proc.pid)
            scope = f"docker-{cid}.scope" if cid else "session-3.scope"
            slice_ = "system.slice" if cid else "user.slice/user-1000.slice"
            img.files[sources.PROC_PID_FILES["cgroup"] % proc.pid] = f"0::/{slice_}/{scope}\n"
            if not proc.maps_readable:
                continue
            libcuda = proc.libcuda or (f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}" if version else None)
            lines = [f"7f3a10000000-7f3a10200000 r-xp 00000000 103:02 1835 {proc.name}"]
            if proc.cudart:
                lines.append(f"7f3a20000000-7f3a20100000 r-xp 00000000 103:02 2211 "
                             f"/usr/local/cuda/lib64/libcudart.so.{proc.cudart}")
            if libcuda:
                lines.append(f"7f3a30000000-7f3a31000000 r-xp 00000000 103:02 3310 {libcuda}")
            img.files[sources.PROC_PID_FILES["maps"] % proc.pid] = "\n".join(lines) + "\n"

