/*
 * Stand-in libnvidia-ml.so.1 for the k3fleet testbed.
 *
 * Implements the part of the NVML C API that pynvml (nvidia-ml-py 13.x) and the
 * stand-in nvidia-smi call, with the same return codes and struct layouts, so
 * that collectors run their production NVML code against a machine without a GPU.
 *
 * One library is compiled per driver version (STANDIN_DRIVER_VERSION and
 * STANDIN_CUDA_VERSION come from the compiler command line). Like the real
 * library it refuses to initialise when the loaded kernel module (the simulated
 * /proc/driver/nvidia/version written at boot) is absent or of another version.
 *
 * Paths can be moved with environment variables so tests need no root:
 *   NVIDIA_SIM_PROC          simulated procfs root      (/run/nvidia-sim/proc)
 *   NVIDIA_SIM_GPUS_CONF     GPU inventory              (/etc/nvidia-sim/gpus.conf)
 *   NVIDIA_SIM_FABRIC_STATE  written by fabric manager  (/run/nvidia-sim/fabricmanager.state)
 *   NVIDIA_SIM_MACHINE_ID    seed of the GPU UUIDs      (/etc/machine-id)
 *
 * Beside the inventory the builder writes, gpus.conf may name faults and load for tests:
 *   lost=<index>[,<index>...]                    GPUs fallen off the bus: every query of one
 *                                                answers NVML_ERROR_GPU_IS_LOST
 *   processes=<index>:<pid>:<MiB>:<name>[,...]   compute processes holding GPU memory
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#ifndef STANDIN_DRIVER_VERSION
#error "STANDIN_DRIVER_VERSION must be defined, e.g. -DSTANDIN_DRIVER_VERSION=\"580.95.05\""
#endif
#ifndef STANDIN_CUDA_VERSION
#error "STANDIN_CUDA_VERSION must be defined, e.g. -DSTANDIN_CUDA_VERSION=13000"
#endif

#define EXPORT __attribute__((visibility("default")))

/* Return codes: the values of nvmlReturn_t (pynvml NVML_ERROR_*). */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* Buffer sizes and limits, as in pynvml. */
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_GPU_FABRIC_UUID_LEN 16
#define NVML_NVLINK_MAX_LINKS 36

#define FABRIC_STATE_NOT_STARTED 1
#define FABRIC_STATE_COMPLETED 3
#define FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED 0
#define FABRIC_HEALTH_SUMMARY_HEALTHY 1

/* Versioned struct tags: (version << 24) | sizeof(struct), as pynvml builds them. */
#define NVML_STRUCT_VERSION(ver, size) ((unsigned int)(((ver) << 24) | (size)))

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define nvmlMemory_v2 NVML_STRUCT_VERSION(2, sizeof(nvmlMemory_v2_t))
#define nvmlGpuFabricInfo_v2 NVML_STRUCT_VERSION(2, sizeof(nvmlGpuFabricInfo_v2_t))
#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION(3, sizeof(nvmlGpuFabricInfo_v3_t))

/* The layouts must match what pynvml passes in, byte for byte. */
_Static_assert(sizeof(nvmlMemory_v2_t) == 0x28, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_v2_t) == 0x24, "nvmlGpuFabricInfo_v2_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_v3_t) == 0x28, "nvmlGpuFabricInfo_v3_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");

/* nvmlProcessInfo_t: what nvmlDeviceGetComputeRunningProcesses_v3 fills. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");

#define MAX_GPUS 64
#define NAME_LEN 96
#define MAX_PROCS 8
#define PROC_NAME_LEN 64

struct sim_proc {
    unsigned int pid;
    unsigned long long used_bytes;
    char name[PROC_NAME_LEN];
};

struct sim_gpu {
    unsigned int index;
    unsigned int domain, bus, device;
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    char uuid[48];
    int lost;
    unsigned int nprocs;
    struct sim_proc procs[MAX_PROCS];
};
typedef struct sim_gpu *nvmlDevice_t;

static struct {
    int refcount;
    unsigned int count;
    char name[NAME_LEN];
    unsigned long long memory_bytes;
    /* What the driver keeps for itself on each GPU: NVML's v1 memory call counts it as used, the v2
     * call reports it apart (a real idle H200 on R580: 644939776 bytes, docs/facts.md section 14). */
    unsigned long long reserved_bytes;
    int cc_major, cc_minor;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned int nvlinks;
    unsigned int persistence;
    unsigned int pcie_gen_max, pcie_width_max;
    unsigned char cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
    struct sim_gpu gpus[MAX_GPUS];
} sim;

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return (v && *v) ? v : fallback;
}

static int copy_out(char *dst, unsigned int length, const char *src)
{
    size_t need = strlen(src) + 1;
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (need > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

static int is_version_token(const char *t)
{
    int dots = 0;
    if (!isdigit((unsigned char)*t))
        return 0;
    for (; *t; t++) {
        if (*t == '.')
            dots++;
        else if (!isdigit((unsigned char)*t))
            return 0;
    }
    return dots >= 1;
}

/*
 * The loaded module version from the first line of <proc>/driver/nvidia/version.
 * The open flavour puts "for x86_64" between "Module" and the version, so take the
 * first version-looking token after "Module" instead of the next token.
 * Returns NVML_SUCCESS, NVML_ERROR_DRIVER_NOT_LOADED (no file) or NVML_ERROR_UNKNOWN.
 */
static nvmlReturn_t read_loaded_version(char *out, size_t outlen)
{
    char path[4096], line[512];
    const char *proc = env_or("NVIDIA_SIM_PROC", "/run/nvidia-sim/proc");
    FILE *f;
    char *tok, *save = NULL;
    int after_module = 0;

    snprintf(path, sizeof(path), "%s/driver/nvidia/version", proc);
    f = fopen(path, "re");
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!fgets(line, sizeof(line), f)) {
        fclose(f);
        return NVML_ERROR_UNKNOWN;
    }
    fclose(f);
    if (strncmp(line, "NVRM version:", 13) != 0)
        return NVML_ERROR_UNKNOWN;
    for (tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
        if (strcmp(tok, "Module") == 0)
            after_module = 1;
        else if (after_module && is_version_token(tok)) {
            snprintf(out, outlen, "%s", tok);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNKNOWN;
}

/* FNV-1a, seeded: only needs to be stable and well spread, not secret. */
static uint64_t fnv1a(const char *s, uint64_t seed)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ seed;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* FNV alone leaves near-identical keys with near-identical hashes: spread the bits. */
static uint64_t avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static void derive_bytes(const char *key, unsigned char out[16])
{
    uint64_t a = avalanche(fnv1a(key, 0x9e3779b97f4a7c15ULL));
    uint64_t b = avalanche(fnv1a(key, 0xc2b2ae3d27d4eb4fULL));
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(a >> (56 - 8 * i));
        out[8 + i] = (unsigned char)(b >> (56 - 8 * i));
    }
}

static void read_machine_id(char *out, size_t outlen)
{
    FILE *f = fopen(env_or("NVIDIA_SIM_MACHINE_ID", "/etc/machine-id"), "re");
    snprintf(out, outlen, "no-machine-id");
    if (f) {
        if (fgets(out, (int)outlen, f))
            out[strcspn(out, " \t\r\n")] = '\0';
        fclose(f);
    }
}

static void trim(char *s)
{
    char *end;
    char *start = s;
    while (isspace((unsigned char)*start))
        start++;
    memmove(s, start, strlen(start) + 1);
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
}

static void parse_bus_ids(char *list)
{
    char *tok, *save = NULL;
    unsigned int n = 0;
    for (tok = strtok_r(list, ",", &save); tok && n < MAX_GPUS; tok = strtok_r(NULL, ",", &save)) {
        unsigned int domain, bus, device, function;
        trim(tok);
        if (sscanf(tok, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4)
            continue;
        sim.gpus[n].domain = domain;
        sim.gpus[n].bus = bus;
        sim.gpus[n].device = device;
        snprintf(sim.gpus[n].bus_id, sizeof(sim.gpus[n].bus_id), "%08X:%02X:%02X.%X",
                 domain, bus, device, function);
        n++;
    }
    if (n < sim.count)
        sim.count = n;
}

/* lost=<index>,...: those GPUs answer NVML_ERROR_GPU_IS_LOST. */
static void parse_lost(char *list)
{
    char *tok, *save = NULL;
    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned long index = strtoul(tok, NULL, 10);
        if (index < sim.count)
            sim.gpus[index].lost = 1;
    }
}

/* processes=<index>:<pid>:<MiB>:<name>,...: compute processes and the memory they hold. */
static void parse_processes(char *list)
{
    char *tok, *save = NULL;
    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned int index, pid;
        unsigned long long mib;
        char name[PROC_NAME_LEN];
        struct sim_gpu *gpu;
        trim(tok);
        if (sscanf(tok, "%u:%u:%llu:%63[^,]", &index, &pid, &mib, name) != 4 || index >= sim.count)
            continue;
        gpu = &sim.gpus[index];
        if (gpu->nprocs >= MAX_PROCS)
            continue;
        gpu->procs[gpu->nprocs].pid = pid;
        gpu->procs[gpu->nprocs].used_bytes = mib * 1024ULL * 1024ULL;
        snprintf(gpu->procs[gpu->nprocs].name, PROC_NAME_LEN, "%s", name);
        gpu->nprocs++;
    }
}

static unsigned long long used_bytes(nvmlDevice_t device)
{
    unsigned long long used = 0;
    for (unsigned int i = 0; i < device->nprocs; i++)
        used += device->procs[i].used_bytes;
    return used;
}

/* Reads the GPU inventory. A missing file means a node without GPUs, not an error. */
static void load_inventory(void)
{
    char line[4096], machine_id[128], key[192];
    char lost[1024] = "", processes[2048] = "";
    FILE *f;

    int refcount = sim.refcount;

    memset(&sim, 0, sizeof(sim));
    sim.refcount = refcount;
    sim.nvlinks = 18;
    /* H100 / H200 SXM: a PCIe Gen 5 x16 link (the H100 capture in tests/fixtures/driver). */
    sim.pcie_gen_max = 5;
    sim.pcie_width_max = 16;
    f = fopen(env_or("NVIDIA_SIM_GPUS_CONF", "/etc/nvidia-sim/gpus.conf"), "re");
    if (f) {
        while (fgets(line, sizeof(line), f)) {
            char *eq = strchr(line, '=');
            if (line[0] == '#' || !eq)
                continue;
            *eq = '\0';
            trim(line);
            trim(eq + 1);
            if (strcmp(line, "count") == 0)
                sim.count = (unsigned int)strtoul(eq + 1, NULL, 10);
            else if (strcmp(line, "name") == 0)
                snprintf(sim.name, sizeof(sim.name), "%s", eq + 1);
            else if (strcmp(line, "memory_mib") == 0)
                sim.memory_bytes = strtoull(eq + 1, NULL, 10) * 1024ULL * 1024ULL;
            else if (strcmp(line, "reserved_bytes") == 0)
                sim.reserved_bytes = strtoull(eq + 1, NULL, 10);
            else if (strcmp(line, "compute_cap") == 0)
                sscanf(eq + 1, "%d.%d", &sim.cc_major, &sim.cc_minor);
            else if (strcmp(line, "pci_device_id") == 0)
                sim.pci_device_id = (unsigned int)strtoul(eq + 1, NULL, 16);
            else if (strcmp(line, "pci_subsystem_id") == 0)
                sim.pci_subsystem_id = (unsigned int)strtoul(eq + 1, NULL, 16);
            else if (strcmp(line, "nvlinks") == 0)
                sim.nvlinks = (unsigned int)strtoul(eq + 1, NULL, 10);
            else if (strcmp(line, "persistence_mode") == 0)
                sim.persistence = strcmp(eq + 1, "1") == 0 || strcmp(eq + 1, "Enabled") == 0;
            else if (strcmp(line, "pcie_gen_max") == 0)
                sim.pcie_gen_max = (unsigned int)strtoul(eq + 1, NULL, 10);
            else if (strcmp(line, "pcie_width_max") == 0)
                sim.pcie_width_max = (unsigned int)strtoul(eq + 1, NULL, 10);
            else if (strcmp(line, "bus_ids") == 0)
                parse_bus_ids(eq + 1);
            else if (strcmp(line, "lost") == 0)
                snprintf(lost, sizeof(lost), "%s", eq + 1);
            else if (strcmp(line, "processes") == 0)
                snprintf(processes, sizeof(processes), "%s", eq + 1);
        }
        fclose(f);
    }
    if (sim.count > MAX_GPUS)
        sim.count = MAX_GPUS;
    /* After the count, whatever the order of the keys. */
    parse_lost(lost);
    parse_processes(processes);
    if (sim.nvlinks > NVML_NVLINK_MAX_LINKS)
        sim.nvlinks = NVML_NVLINK_MAX_LINKS;

    read_machine_id(machine_id, sizeof(machine_id));
    /* One HGX board: NVLink inside the node only, so NVML reports the zero ClusterUUID and clique 0
       (the 8x H100 nvidia-smi -q capture, docs/facts.md section 15); a multi-node NVLink domain
       (NVL72) is the lab's, not the testbed's. */
    memset(sim.cluster_uuid, 0, sizeof(sim.cluster_uuid));
    for (unsigned int i = 0; i < sim.count; i++) {
        unsigned char u[16];
        snprintf(key, sizeof(key), "%s:gpu:%u", machine_id, i);
        derive_bytes(key, u);
        sim.gpus[i].index = i;
        snprintf(sim.gpus[i].uuid, sizeof(sim.gpus[i].uuid),
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7],
                 u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    }
}

static nvmlReturn_t do_init(void)
{
    char loaded[64];
    nvmlReturn_t rc = read_loaded_version(loaded, sizeof(loaded));
    if (rc != NVML_SUCCESS)
        return rc;
    if (strcmp(loaded, STANDIN_DRIVER_VERSION) != 0)
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    pthread_mutex_lock(&sim_lock);
    if (sim.refcount == 0)
        load_inventory();
    sim.refcount++;
    pthread_mutex_unlock(&sim_lock);
    return NVML_SUCCESS;
}

static int initialised(void)
{
    int r;
    pthread_mutex_lock(&sim_lock);
    r = sim.refcount > 0;
    pthread_mutex_unlock(&sim_lock);
    return r;
}

static nvmlReturn_t check_device(nvmlDevice_t device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || device < sim.gpus || device >= sim.gpus + sim.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* check_device, then whether the caller gave every pointer the query writes its answer through (a NULL one:
 * invalid argument). */
static nvmlReturn_t check_query(nvmlDevice_t device, int answer_pointers_given)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    return answer_pointers_given ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* How every device query begins: a bad handle or a missing answer pointer returns its NVML error. */
#define RETURN_IF_BAD_QUERY(device, answer_pointers_given)                        \
    do {                                                                          \
        nvmlReturn_t query_rc_ = check_query((device), (answer_pointers_given)); \
        if (query_rc_ != NVML_SUCCESS)                                            \
            return query_rc_;                                                     \
    } while (0)

/*
 * The fabric is up while the fabric manager runs: it writes its pid into the
 * state file and removes the file when it stops; a stale file (the process was
 * killed) is ignored.
 */
static int fabric_completed(void)
{
    FILE *f = fopen(env_or("NVIDIA_SIM_FABRIC_STATE", "/run/nvidia-sim/fabricmanager.state"), "re");
    char line[256];
    long pid = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "pid=", 4) == 0)
            pid = strtol(line + 4, NULL, 10);
    }
    fclose(f);
    if (pid <= 0)
        return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* ---- initialisation --------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init();
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&sim_lock);
    if (sim.refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        sim.refcount--;
    pthread_mutex_unlock(&sim_lock);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system ------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, length, STANDIN_DRIVER_VERSION);
}

/* "<CUDA major>.<driver version>", answered before nvmlInit like the real library. */
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[80];
    snprintf(buf, sizeof(buf), "%d.%s", STANDIN_CUDA_VERSION / 1000, STANDIN_DRIVER_VERSION);
    return copy_out(version, length, buf);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = STANDIN_CUDA_VERSION;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- device enumeration ---------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = sim.count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= sim.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &sim.gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < sim.count; i++) {
        if (strcmp(sim.gpus[i].uuid, uuid) == 0) {
            *device = &sim.gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int domain, bus, dev, function;
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &dev, &function) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < sim.count; i++) {
        if (sim.gpus[i].domain == domain && sim.gpus[i].bus == bus && sim.gpus[i].device == dev) {
            *device = &sim.gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- device queries --------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    RETURN_IF_BAD_QUERY(device, index != NULL);
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return nvmlDeviceGetIndex(device, minorNumber);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t rc = check_device(device);
    return rc != NVML_SUCCESS ? rc : copy_out(name, length, sim.name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t rc = check_device(device);
    return rc != NVML_SUCCESS ? rc : copy_out(uuid, length, device->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    RETURN_IF_BAD_QUERY(device, memory != NULL);
    /* What the compute processes hold, and (as the real v1 call does) the driver's reserved memory. */
    memory->total = sim.memory_bytes;
    memory->used = used_bytes(device) + sim.reserved_bytes;
    memory->free = sim.memory_bytes - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    RETURN_IF_BAD_QUERY(device, memory != NULL);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = sim.memory_bytes;
    memory->reserved = sim.reserved_bytes;
    memory->used = used_bytes(device);
    memory->free = sim.memory_bytes - memory->used - sim.reserved_bytes;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    RETURN_IF_BAD_QUERY(device, mode != NULL);
    *mode = (int)sim.persistence;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode)
{
    RETURN_IF_BAD_QUERY(device, mode != NULL);
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode)
{
    RETURN_IF_BAD_QUERY(device, currentMode && pendingMode);
    *currentMode = 0;
    *pendingMode = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    RETURN_IF_BAD_QUERY(device, major && minor);
    *major = sim.cc_major;
    *minor = sim.cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    RETURN_IF_BAD_QUERY(device, pci != NULL);
    memset(pci, 0, sizeof(*pci));
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = sim.pci_device_id;
    pci->pciSubSystemId = sim.pci_subsystem_id;
    snprintf(pci->busId, sizeof(pci->busId), "%s", device->bus_id);
    /* The legacy field only holds the short domain form. */
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0",
             device->domain & 0xffff, device->bus, device->device);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive)
{
    RETURN_IF_BAD_QUERY(device, isActive && link < sim.nvlinks);
    /* Links to the NVSwitches are trained by the fabric manager. */
    *isActive = fabric_completed();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                                    unsigned long long *counterValue)
{
    /* nvmlNvLinkErrorCounter_t: DL replay, recovery, CRC flit, CRC data, ECC data (0-4). */
    RETURN_IF_BAD_QUERY(device, counterValue && link < sim.nvlinks && counter >= 0 && counter <= 4);
    /* A healthy fabric: no link has replayed, recovered or seen a CRC error. */
    *counterValue = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    RETURN_IF_BAD_QUERY(device, value != NULL);
    *value = 0; /* a link at its full generation and width has not replayed */
    return NVML_SUCCESS;
}

static void fill_fabric(unsigned char *uuid, nvmlReturn_t *status, unsigned int *clique,
                        unsigned int *state)
{
    int up = fabric_completed();
    memcpy(uuid, sim.cluster_uuid, NVML_GPU_FABRIC_UUID_LEN);
    *status = NVML_SUCCESS;
    *clique = 0;
    *state = up ? FABRIC_STATE_COMPLETED : FABRIC_STATE_NOT_STARTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
    RETURN_IF_BAD_QUERY(device, info != NULL);
    fill_fabric(info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    return NVML_SUCCESS;
}

/* The caller states which struct it passed in the first word (pynvml: c_nvmlGpuFabricInfoV_t). */
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *info)
{
    nvmlReturn_t rc = check_device(device);
    unsigned int version;
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    memcpy(&version, info, sizeof(version));
    if (version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t *v2 = info;
        fill_fabric(v2->clusterUuid, &v2->status, &v2->cliqueId, &v2->state);
        v2->healthMask = 0;
        return NVML_SUCCESS;
    }
    if (version == nvmlGpuFabricInfo_v3) {
        nvmlGpuFabricInfo_v3_t *v3 = info;
        fill_fabric(v3->clusterUuid, &v3->status, &v3->cliqueId, &v3->state);
        v3->healthMask = 0;
        v3->healthSummary = v3->state == FABRIC_STATE_COMPLETED ? FABRIC_HEALTH_SUMMARY_HEALTHY
                                                                : FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

/* ---- GPU health: a healthy, idle GPU (docs/facts.md section 14) ---------- */

#define NVML_MEMORY_ERROR_TYPE_COUNT 2
#define NVML_ECC_COUNTER_TYPE_COUNT 2
#define NVML_CLOCKS_EVENT_REASON_GPU_IDLE 0x1ULL

/* No uncorrected or corrected error, volatile or aggregate; other types are invalid as in NVML. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                                unsigned long long *eccCounts)
{
    nvmlReturn_t rc = check_device(device);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!eccCounts || errorType < 0 || errorType >= NVML_MEMORY_ERROR_TYPE_COUNT || counterType < 0 ||
        counterType >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eccCounts = 0;
    return NVML_SUCCESS;
}

/* ECC on, as data-center GPUs ship (the H100 capture: Current and Pending Enabled). */
EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending)
{
    RETURN_IF_BAD_QUERY(device, current && pending);
    *current = 1; /* NVML_FEATURE_ENABLED */
    *pending = 1;
    return NVML_SUCCESS;
}

/* No row remapped, none pending, no remapping failure. */
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    RETURN_IF_BAD_QUERY(device, corrRows && uncRows && isPending && failureOccurred);
    *corrRows = *uncRows = *isPending = *failureOccurred = 0;
    return NVML_SUCCESS;
}

/* An idle GPU: the only clock event is "GPU idle"; never a hardware slowdown. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    RETURN_IF_BAD_QUERY(device, reasons != NULL);
    *reasons = NVML_CLOCKS_EVENT_REASON_GPU_IDLE;
    return NVML_SUCCESS;
}

/* The name of the same call before R535. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

static nvmlReturn_t link_value(nvmlDevice_t device, unsigned int *out, unsigned int value)
{
    RETURN_IF_BAD_QUERY(device, out != NULL);
    *out = value;
    return NVML_SUCCESS;
}

/* The link trained at its maximum generation and width. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return link_value(device, gen, sim.pcie_gen_max);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return link_value(device, gen, sim.pcie_gen_max);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return link_value(device, width, sim.pcie_width_max);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return link_value(device, width, sim.pcie_width_max);
}

/*
 * The compute processes of gpus.conf (none unless it names some). NVML's two-call protocol: with
 * no process the first call (count 0, no array) succeeds and sets the count to 0; with some, a
 * count too small answers NVML_ERROR_INSUFFICIENT_SIZE and sets the count needed.
 */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    RETURN_IF_BAD_QUERY(device, infoCount != NULL);
    if (*infoCount < device->nprocs || (device->nprocs && !infos)) {
        *infoCount = device->nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < device->nprocs; i++) {
        infos[i].pid = device->procs[i].pid;
        infos[i].usedGpuMemory = device->procs[i].used_bytes;
        /* Not a MIG instance. */
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *infoCount = device->nprocs;
    return NVML_SUCCESS;
}

/* The name of a process of gpus.conf's processes; NVML_ERROR_NOT_FOUND for any other pid. */
EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int g = 0; g < sim.count; g++) {
        for (unsigned int i = 0; i < sim.gpus[g].nprocs; i++) {
            if (sim.gpus[g].procs[i].pid == pid)
                return copy_out(name, length, sim.gpus[g].procs[i].name);
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
