"""The node as Slurm shows it: ``scontrol show node`` and the running jobs ``squeue`` lists."""

from __future__ import annotations

from k3fleet.lab.render.node import LAB_ISO_TIME, Part, Recording


class SchedulerView(Part):
    """The Slurm side of one host; both outputs name the host, so they are host-specific."""

    def scontrol_show_node(self, node: str) -> Recording:
        s = self.p.slurm
        assert s is not None
        cpus = s.sockets * s.cores_per_socket * s.threads_per_core
        gres_type = self.p.gpus.model.split()[-1].lower()
        gpus = self.p.gpus.count
        state = {"idle": "IDLE", "mixed": "MIXED", "allocated": "ALLOCATED", "drained": "IDLE+DRAIN",
                 "draining": "MIXED+DRAIN", "down": "DOWN+NOT_RESPONDING"}[s.state]
        share = 1.0 if s.state == "allocated" else min(1.0, 0.5 * len(s.jobs))
        if s.state in ("idle", "drained", "down"):
            share = 0.0
        cpu_alloc = int(cpus * share)
        mem_alloc = int(s.real_memory_mb * share)
        gpu_alloc = int(gpus * share)
        alloc_tres = (f"cpu={cpu_alloc},mem={mem_alloc}M,gres/gpu={gpu_alloc}" if cpu_alloc else "")
        fields = [
            f"NodeName={node}", "Arch=x86_64", f"CoresPerSocket={s.cores_per_socket}",
            f"CPUAlloc={cpu_alloc}", f"CPUEfctv={cpus}", f"CPUTot={cpus}", f"CPULoad={share * 180:.2f}",
            f"AvailableFeatures={gres_type}", f"ActiveFeatures={gres_type}",
            f"Gres=gpu:{gres_type}:{gpus}", f"NodeAddr={node}", f"NodeHostName={node}",
            f"Version={s.version}", f"OS=Linux {self.kernel} #1 SMP",
            f"RealMemory={s.real_memory_mb}", f"AllocMem={mem_alloc}",
            f"FreeMem={s.real_memory_mb - mem_alloc - 12000}", f"Sockets={s.sockets}", "Boards=1",
            f"State={state}", f"ThreadsPerCore={s.threads_per_core}", "TmpDisk=0", "Weight=1",
            "Owner=N/A", "MCS_label=N/A", f"Partitions={s.partition}",
            "BootTime=2025-09-01T08:00:00", "SlurmdStartTime=2025-09-01T08:02:11",
            f"LastBusyTime={LAB_ISO_TIME}", "ResumeAfterTime=None",
            f"CfgTRES=cpu={cpus},mem={s.real_memory_mb}M,billing={cpus},gres/gpu={gpus}",
            f"AllocTRES={alloc_tres}", "CurrentWatts=0", "AveWatts=0",
        ]
        reason = s.reason or ("Not responding" if s.state == "down" else None)
        if reason:
            fields.append(f"Reason={reason} [root@{LAB_ISO_TIME}]")
        return Recording(stdout=" ".join(fields) + "\n")

    def squeue_running(self) -> Recording:
        s = self.p.slurm
        assert s is not None
        return Recording(stdout="".join(f"{job}\n" for job in s.jobs))

