/*
 * A stand-in for NVIDIA's libnvidia-ml.so.1, for tests only.
 *
 * It exports the NVML entry points that the node agent reads through pynvml, with the real
 * signatures, structure layouts and return codes (nvml.h), so pynvml's own ctypes calls run
 * against it unchanged. What it reports is scripted by the test through a text state file named
 * by the environment variable NVML_STANDIN_STATE, re-read on every call (write it atomically:
 * to a temporary name, then rename). Lines (whitespace separated, '#' starts a comment):
 *
 *   driver VERSION
 *   gpu INDEX key=value ...         keys: uuid bus ecc_vol_cor ecc_vol_unc ecc_agg_cor ecc_agg_unc
 *                                   retired_sbe retired_dbe retired_pending remap_cor remap_unc
 *                                   remap_pending remap_failed clocks temp power_mw sm_mhz
 *                                   util_gpu util_mem nvlinks nvlink_replay nvlink_recovery
 *                                   nvlink_crc_flit nvlink_crc_data recovery lost
 *   name INDEX TEXT...              the product name (rest of the line)
 *   fail INDEX|* FUNCTION CODE      FUNCTION (e.g. nvmlDeviceGetRemappedRows) returns CODE
 *   delay INDEX|* FUNCTION MS       FUNCTION sleeps MS milliseconds first (a wedged driver)
 *   xid SEQ INDEX CODE              an XID event; delivered to event sets registered before it
 *
 * Values not given read as 0; "recovery=-1" or "nvlinks=0" mean not supported.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_GPUS 64
#define MAX_RULES 128
#define MAX_XIDS 1024

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999
};
#define EVENT_XID 0x8ULL
#define FI_RECOVERY_ACTION 230

typedef struct { int index; } device_t;
typedef device_t *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    long long sllVal; int siVal; unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct {
    int used;
    unsigned long long last_seq;
    unsigned long long types[MAX_GPUS];
} event_set_t;
typedef event_set_t *nvmlEventSet_t;

typedef struct {
    int present;
    char uuid[96], name[96], bus[32];
    long long ecc_vol_cor, ecc_vol_unc, ecc_agg_cor, ecc_agg_unc;
    long long retired_sbe, retired_dbe, retired_pending;
    long long remap_cor, remap_unc, remap_pending, remap_failed;
    long long clocks, temp, power_mw, sm_mhz, util_gpu, util_mem;
    long long nvlinks, nvlink_replay, nvlink_recovery, nvlink_crc_flit, nvlink_crc_data;
    long long recovery, lost;
} gpu_t;

typedef struct { int gpu; char fn[64]; int value; } rule_t;  /* gpu -1: every GPU */
typedef struct { unsigned long long seq; int gpu; int code; } xid_t;

typedef struct {
    char driver[80];
    int count;
    gpu_t gpus[MAX_GPUS];
    rule_t fails[MAX_RULES]; int nfails;
    rule_t delays[MAX_RULES]; int ndelays;
    xid_t xids[MAX_XIDS]; int nxids;
} state_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static state_t st;
static device_t devices[MAX_GPUS];
static int initialized;

static long long *gpu_field(gpu_t *g, const char *key) {
#define F(k) if (strcmp(key, #k) == 0) return &g->k;
    F(ecc_vol_cor) F(ecc_vol_unc) F(ecc_agg_cor) F(ecc_agg_unc)
    F(retired_sbe) F(retired_dbe) F(retired_pending)
    F(remap_cor) F(remap_unc) F(remap_pending) F(remap_failed)
    F(clocks) F(temp) F(power_mw) F(sm_mhz) F(util_gpu) F(util_mem)
    F(nvlinks) F(nvlink_replay) F(nvlink_recovery) F(nvlink_crc_flit) F(nvlink_crc_data)
    F(recovery) F(lost)
#undef F
    return NULL;
}

static int parse_gpu_index(const char *s) {
    if (s == NULL) return -2;
    if (strcmp(s, "*") == 0) return -1;
    int i = atoi(s);
    return (i >= 0 && i < MAX_GPUS) ? i : -2;
}

static void parse_gpu(char *rest) {
    int i = parse_gpu_index(strtok(rest, " \t\n"));
    if (i < 0) return;
    gpu_t *g = &st.gpus[i];
    g->present = 1;
    if (i + 1 > st.count) st.count = i + 1;
    char *tok;
    while ((tok = strtok(NULL, " \t\n")) != NULL) {
        char *eq = strchr(tok, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        const char *val = eq + 1;
        if (strcmp(tok, "uuid") == 0) snprintf(g->uuid, sizeof g->uuid, "%s", val);
        else if (strcmp(tok, "bus") == 0) snprintf(g->bus, sizeof g->bus, "%s", val);
        else { long long *f = gpu_field(g, tok); if (f) *f = strtoll(val, NULL, 0); }
    }
}

static void parse_rule(char *rest, rule_t *rules, int *n) {
    int gpu = parse_gpu_index(strtok(rest, " \t\n"));
    char *fn = strtok(NULL, " \t\n"), *val = strtok(NULL, " \t\n");
    if (gpu == -2 || fn == NULL || val == NULL || *n >= MAX_RULES) return;
    rules[*n].gpu = gpu;
    snprintf(rules[*n].fn, sizeof rules[*n].fn, "%s", fn);
    rules[*n].value = atoi(val);
    (*n)++;
}

static void reload(void) {
    memset(&st, 0, sizeof st);
    const char *path = getenv("NVML_STANDIN_STATE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f == NULL) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *kw = strtok(line, " \t\n");
        if (kw == NULL) continue;
        char *rest = kw + strlen(kw) + 1;
        if (strcmp(kw, "driver") == 0) {
            char *v = strtok(NULL, " \t\n");
            if (v) snprintf(st.driver, sizeof st.driver, "%s", v);
        } else if (strcmp(kw, "gpu") == 0) {
            parse_gpu(rest);
        } else if (strcmp(kw, "name") == 0) {
            int i = parse_gpu_index(strtok(rest, " \t"));
            char *text = strtok(NULL, "\n");
            if (i >= 0 && text) snprintf(st.gpus[i].name, sizeof st.gpus[i].name, "%s", text);
        } else if (strcmp(kw, "fail") == 0) {
            parse_rule(rest, st.fails, &st.nfails);
        } else if (strcmp(kw, "delay") == 0) {
            parse_rule(rest, st.delays, &st.ndelays);
        } else if (strcmp(kw, "xid") == 0 && st.nxids < MAX_XIDS) {
            char *seq = strtok(rest, " \t\n"), *gpu = strtok(NULL, " \t\n"), *code = strtok(NULL, " \t\n");
            if (seq && gpu && code) {
                xid_t *x = &st.xids[st.nxids++];
                x->seq = strtoull(seq, NULL, 10); x->gpu = atoi(gpu); x->code = atoi(code);
            }
        }
    }
    fclose(f);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

static int rule_value(const rule_t *rules, int n, int gpu, const char *fn) {
    for (int i = 0; i < n; i++)
        if ((rules[i].gpu == -1 || rules[i].gpu == gpu) && strcmp(rules[i].fn, fn) == 0)
            return rules[i].value;
    return 0;
}

/* Re-read the state; apply the scripted delay and failure of FN for GPU (-1: not a GPU call).
 * Returns with the lock held when it returns NVML_SUCCESS. */
static nvmlReturn_t enter(const char *fn, int gpu) {
    pthread_mutex_lock(&lock);
    reload();
    int delay = rule_value(st.delays, st.ndelays, gpu, fn);
    int fail = rule_value(st.fails, st.nfails, gpu, fn);
    if (delay > 0) { pthread_mutex_unlock(&lock); sleep_ms(delay); pthread_mutex_lock(&lock); }
    if (fail != 0) { pthread_mutex_unlock(&lock); return fail; }
    return NVML_SUCCESS;
}

/* enter() for a device call: checks the handle, init and a lost GPU too. */
static nvmlReturn_t enter_dev(const char *fn, nvmlDevice_t dev, gpu_t **g) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (dev == NULL || dev < devices || dev >= devices + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(fn, dev->index);
    if (rc != NVML_SUCCESS) return rc;
    *g = &st.gpus[dev->index];
    if (!(*g)->present) { pthread_mutex_unlock(&lock); return NVML_ERROR_INVALID_ARGUMENT; }
    if ((*g)->lost) { pthread_mutex_unlock(&lock); return NVML_ERROR_GPU_IS_LOST; }
    return NVML_SUCCESS;
}

#define DONE(rc) do { pthread_mutex_unlock(&lock); return (rc); } while (0)
#define EXPORT __attribute__((visibility("default")))

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t rc = enter("nvmlInitWithFlags", -1);
    if (rc != NVML_SUCCESS) return rc;
    for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
    initialized++;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (!initialized) DONE(NVML_ERROR_UNINITIALIZED);
    initialized--;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = enter("nvmlSystemGetDriverVersion", -1);
    if (rc != NVML_SUCCESS) return rc;
    if (strlen(st.driver) + 1 > length) DONE(NVML_ERROR_INSUFFICIENT_SIZE);
    strcpy(version, st.driver);
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = enter("nvmlDeviceGetCount_v2", -1);
    if (rc != NVML_SUCCESS) return rc;
    *count = (unsigned int)st.count;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (rc != NVML_SUCCESS) return rc;
    if (index >= (unsigned int)st.count || !st.gpus[index].present) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *device = &devices[index];
    DONE(NVML_SUCCESS);
}

static nvmlReturn_t copy_text(const char *src, char *dst, unsigned int length) {
    if (strlen(src) + 1 > length) DONE(NVML_ERROR_INSUFFICIENT_SIZE);
    strcpy(dst, src);
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetUUID", d, &g);
    return rc != NVML_SUCCESS ? rc : copy_text(g->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetName", d, &g);
    return rc != NVML_SUCCESS ? rc : copy_text(g->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetPciInfo_v3", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->bus);
    unsigned int dom = 0, bus = 0, dev = 0;
    if (sscanf(g->bus, "%x:%x:%x", &dom, &bus, &dev) == 3) { pci->domain = dom; pci->bus = bus; pci->device = dev; }
    pci->pciDeviceId = 0x233010DE;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType,
                                                unsigned long long *count) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetTotalEccErrors", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1) DONE(NVML_ERROR_INVALID_ARGUMENT);
    long long v = counterType == 0 ? (errorType == 0 ? g->ecc_vol_cor : g->ecc_vol_unc)
                                   : (errorType == 0 ? g->ecc_agg_cor : g->ecc_agg_unc);
    if (v < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    *count = (unsigned long long)v;
    DONE(NVML_SUCCESS);
}

static nvmlReturn_t retired(const char *fn, nvmlDevice_t d, int cause, unsigned int *count,
                            unsigned long long *addresses, unsigned long long *timestamps) {
    gpu_t *g; nvmlReturn_t rc = enter_dev(fn, d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (cause < 0 || cause > 1 || count == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    long long n = cause == 0 ? g->retired_sbe : g->retired_dbe;
    if (n < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    if (addresses == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        DONE(n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (long long i = 0; i < n; i++) {
        addresses[i] = 0x1000ULL * (unsigned long long)(i + 1) + (unsigned long long)cause;
        if (timestamps) timestamps[i] = 1700000000ULL + (unsigned long long)i;
    }
    *count = (unsigned int)n;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    return retired("nvmlDeviceGetRetiredPages", d, cause, count, addresses, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, int cause, unsigned int *count,
                                                 unsigned long long *addresses, unsigned long long *timestamps) {
    return retired("nvmlDeviceGetRetiredPages_v2", d, cause, count, addresses, timestamps);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *isPending) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetRetiredPagesPendingStatus", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->retired_pending < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    *isPending = g->retired_pending ? 1 : 0;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetRemappedRows", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->remap_cor < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    *corr = (unsigned int)g->remap_cor; *unc = (unsigned int)g->remap_unc;
    *pending = g->remap_pending ? 1 : 0; *failure = g->remap_failed ? 1 : 0;
    DONE(NVML_SUCCESS);
}

static nvmlReturn_t clocks(const char *fn, nvmlDevice_t d, unsigned long long *reasons) {
    gpu_t *g; nvmlReturn_t rc = enter_dev(fn, d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->clocks < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    *reasons = (unsigned long long)g->clocks;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
    return clocks("nvmlDeviceGetCurrentClocksEventReasons", d, r);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    return clocks("nvmlDeviceGetCurrentClocksThrottleReasons", d, r);
}

static nvmlReturn_t uint_value(const char *fn, nvmlDevice_t d, size_t offset, unsigned int *out) {
    gpu_t *g; nvmlReturn_t rc = enter_dev(fn, d, &g);
    if (rc != NVML_SUCCESS) return rc;
    long long v = *(long long *)((char *)g + offset);
    if (v < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    *out = (unsigned int)v;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    return uint_value("nvmlDeviceGetTemperature", d, offsetof(gpu_t, temp), temp);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *power) {
    return uint_value("nvmlDeviceGetPowerUsage", d, offsetof(gpu_t, power_mw), power);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *clock) {
    if (type != 1) return NVML_ERROR_NOT_SUPPORTED;  /* only NVML_CLOCK_SM is scripted */
    return uint_value("nvmlDeviceGetClockInfo", d, offsetof(gpu_t, sm_mhz), clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetUtilizationRates", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->util_gpu < 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    u->gpu = (unsigned int)g->util_gpu; u->memory = (unsigned int)g->util_mem;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *isActive) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetNvLinkState", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->nvlinks <= 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned int)g->nvlinks) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = 1;
    DONE(NVML_SUCCESS);
}

/* Counters are scripted per GPU and reported on link 0; the other links read 0. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter,
                                                    unsigned long long *value) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetNvLinkErrorCounter", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (g->nvlinks <= 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned int)g->nvlinks || counter < 0 || counter > 4) DONE(NVML_ERROR_INVALID_ARGUMENT);
    long long v = 0;
    if (link == 0) {
        switch (counter) {
        case 0: v = g->nvlink_replay; break;
        case 1: v = g->nvlink_recovery; break;
        case 2: v = g->nvlink_crc_flit; break;
        case 3: v = g->nvlink_crc_data; break;
        default: v = 0;
        }
    }
    *value = (unsigned long long)v;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceGetFieldValues", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (count < 0 || (count > 0 && values == NULL)) DONE(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)time(NULL) * 1000000LL;
        v->latencyUsec = 0;
        if (v->fieldId == FI_RECOVERY_ACTION && g->recovery >= 0) {
            v->valueType = 1;  /* NVML_VALUE_TYPE_UNSIGNED_INT */
            v->nvmlReturn = NVML_SUCCESS;
            v->value.ullVal = 0;
            v->value.uiVal = (unsigned int)g->recovery;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    DONE(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ events */

static unsigned long long max_seq(void) {
    unsigned long long m = 0;
    for (int i = 0; i < st.nxids; i++) if (st.xids[i].seq > m) m = st.xids[i].seq;
    return m;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = enter("nvmlEventSetCreate", -1);
    if (rc != NVML_SUCCESS) return rc;
    event_set_t *s = calloc(1, sizeof *s);
    if (s == NULL) DONE(NVML_ERROR_UNKNOWN);
    s->used = 1;
    s->last_seq = max_seq();
    *set = s;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    gpu_t *g; nvmlReturn_t rc = enter_dev("nvmlDeviceRegisterEvents", d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (set == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~EVENT_XID) DONE(NVML_ERROR_NOT_SUPPORTED);  /* only XID events are scripted */
    set->types[d->index] |= types;
    DONE(NVML_SUCCESS);
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        if (!initialized) return NVML_ERROR_UNINITIALIZED;
        nvmlReturn_t rc = enter("nvmlEventSetWait_v2", -1);
        if (rc != NVML_SUCCESS) return rc;
        const xid_t *next = NULL;
        for (int i = 0; i < st.nxids; i++) {
            const xid_t *x = &st.xids[i];
            if (x->seq > set->last_seq && x->gpu >= 0 && x->gpu < MAX_GPUS && (set->types[x->gpu] & EVENT_XID)
                && (next == NULL || x->seq < next->seq))
                next = x;
        }
        if (next != NULL) {
            set->last_seq = next->seq;
            memset(data, 0, sizeof *data);
            data->device = &devices[next->gpu];
            data->eventType = EVENT_XID;
            data->eventData = (unsigned long long)next->code;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            DONE(NVML_SUCCESS);
        }
        pthread_mutex_unlock(&lock);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed = (now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L;
        if (elapsed >= (long)timeoutms) return NVML_ERROR_TIMEOUT;
        long left = (long)timeoutms - elapsed;
        sleep_ms(left < 5 ? left : 5);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return wait_event(set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    free(set);
    return NVML_SUCCESS;
}
