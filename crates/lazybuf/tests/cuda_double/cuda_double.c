/*
 * TEST DOUBLE of the CUDA driver API (libcuda), for lazybuf's tests. NOT a CUDA driver.
 *
 * It implements, over ordinary host memory, exactly the driver entry points lazybuf's CUDA
 * backend calls, with the real signatures and CUresult codes, so the backend's code paths run
 * on machines without a GPU. Device pointers are host allocations. Work is asynchronous as on
 * a GPU: each stream has a worker thread that runs its commands in order (copies, memsets,
 * event records, waits on other streams' events) after the call that enqueued them has
 * returned; events complete when their stream reaches them. It checks what a driver checks,
 * when the driver checks it (initialization, a current context on the calling thread,
 * handles, bounds of device ranges: at the call) and answers with the driver's error codes,
 * so backend bugs show up as errors. Freeing memory waits for every stream to drain, as
 * cuMemFree's implicit synchronization does. The legacy NULL stream runs its commands at the
 * call, after the work queued on the device's *blocking* streams (made with flags 0), as
 * CUDA's legacy default stream waits for them; non-blocking streams are not waited for.
 *
 * Configuration (read once, by cuInit):
 *   LAZYBUF_CUDA_DOUBLE_DEVICES  number of devices, 0..8 (default 2; 0: cuInit fails with
 *                                CUDA_ERROR_NO_DEVICE, like a driver without a GPU)
 *   LAZYBUF_CUDA_DOUBLE_PEER     1 (default): devices can access each other (peer copies);
 *                                0: cuDeviceCanAccessPeer says no
 *   LAZYBUF_CUDA_DOUBLE_MEMORY   bytes of memory per device (default 2 GiB)
 *   LAZYBUF_CUDA_DOUBLE_MANAGED  2 (default): managed memory with concurrent access (prefetch
 *                                works, as on Linux with Pascal or later); 1: managed memory
 *                                without concurrent access (prefetch is refused); 0: none
 *                                (cuMemAllocManaged fails with CUDA_ERROR_NOT_SUPPORTED)
 *
 * Built with -DLAZYBUF_CUDA_DOUBLE_OLD_DRIVER it lacks cuMemcpyPeerAsync, like a driver too old
 * for the backend, which must then report CUDA unavailable instead of panicking.
 *
 * Test hooks (exported; reach them with dlopen(RTLD_NOLOAD) + dlsym):
 *   lazybuf_cuda_double_fail_allocation(n)  the n-th allocation from now (cuMemAlloc,
 *                                           cuMemHostAlloc) fails with OUT_OF_MEMORY; 0 disarms
 *   lazybuf_cuda_double_fail_free(n)        the n-th cuMemFree from now frees the memory and
 *                                           returns CUDA_ERROR_LAUNCH_FAILED (a sticky fault
 *                                           reported at free); 0 disarms
 *   lazybuf_cuda_double_fail_copy(n)        the n-th device write from now (any memcpy or
 *                                           memset) is enqueued fine, then, when its stream
 *                                           runs it, writes garbage over the first half of its
 *                                           destination and fails: the next event recorded on
 *                                           that stream (and cuStreamSynchronize) reports
 *                                           CUDA_ERROR_LAUNCH_FAILED, as a GPU reports a
 *                                           failure during execution; 0 disarms
 *   lazybuf_cuda_double_fail_copy_now(n)    as fail_copy, but the enqueuing call itself fails
 *                                           (CUDA_ERROR_UNKNOWN) after scribbling; 0 disarms
 *   lazybuf_cuda_double_hold(on)            1: no stream starts a command until 0 is passed
 *                                           (tests of overlap with the host)
 *   lazybuf_cuda_double_live_allocations()  device and pinned host allocations not yet freed
 *   lazybuf_cuda_double_registrations()     host ranges registered and not yet unregistered
 *   lazybuf_cuda_double_copies()            device writes enqueued so far (memcpy and memset)
 *   lazybuf_cuda_double_pinned_copies()     host<->device copies whose host side was pinned
 *                                           (allocated by cuMemHostAlloc, or registered)
 *   lazybuf_cuda_double_prefetch_location(p) where managed memory at p was last prefetched
 *                                           to, once its stream got there: a device ordinal,
 *                                           -1 the host, -2 never; -3 if p is not managed
 *
 * See README.md beside this file.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 8

typedef enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

/* Attribute and flag values from cuda.h. */
enum {
    ATTR_INTEGRATED = 18,
    ATTR_UNIFIED_ADDRESSING = 41,
    ATTR_CC_MAJOR = 75,
    ATTR_CC_MINOR = 76,
    ATTR_MANAGED_MEMORY = 83,
    ATTR_CONCURRENT_MANAGED_ACCESS = 89,
};
enum { MEM_ATTACH_GLOBAL = 1, MEM_ATTACH_HOST = 2, DEVICE_CPU = -1 };
enum { MEMHOSTALLOC_ALL_FLAGS = 1 | 2 | 4 };

typedef struct CUctx_st {
    int device;
    int retained;
} *CUcontext;

typedef struct CUevent_st {
    unsigned long long recorded;  /* records made so far */
    unsigned long long completed; /* the last record its stream has reached */
    CUresult status;              /* the failures of the work before the last completed record */
    int refs;                     /* the handle's, plus one per queued command naming it */
    struct CUevent_st *next;
} *CUevent;

enum kind { CMD_COPY, CMD_MEMSET, CMD_RECORD, CMD_WAIT, CMD_PREFETCH };

/* One queued piece of work. Arguments were checked when it was enqueued. */
struct command {
    enum kind kind;
    char *dst;
    const char *src;
    size_t n;                    /* copy: bytes */
    unsigned char value[4];      /* memset: the unit */
    size_t width, count, pitch;  /* memset: unit bytes, units, bytes between units (0: width) */
    CUevent event;               /* record, wait */
    struct allocation *range;    /* prefetch: the managed allocation */
    int location;                /* prefetch: where to */
    unsigned long long target;   /* record: its number; wait: the record to wait for */
    CUresult fail;               /* the injected failure this command has, or CUDA_SUCCESS */
    struct command *next;
};

typedef struct CUstream_st {
    int device;
    int blocking; /* made with flags 0: the legacy NULL stream waits for its work */
    int destroyed;
    struct command *head, *tail;
    CUresult error; /* failures since the last event record */
    struct CUstream_st *next;
} *CUstream;

struct allocation {
    char *base;
    size_t size;
    int device; /* >= 0: device memory; -1: pinned host memory; -2: registered host range */
    unsigned flags;
    int managed;  /* device memory from cuMemAllocManaged */
    int location; /* managed: where it was last prefetched to (-2: never) */
    struct allocation *next;
};

struct device {
    struct CUctx_st ctx;
    size_t total, used;
    int peer_enabled[MAX_DEVICES];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Workers wait on `wake` for commands (or the end of a hold); everyone who waits for work to
 * finish waits on `progress`, broadcast whenever a command completes. */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER, progress = PTHREAD_COND_INITIALIZER;
static int initialized, device_count, peer_allowed, managed_level, holding;
static struct device devices[MAX_DEVICES];
static struct allocation *allocations;
static CUstream streams;
static CUevent events;
static __thread CUcontext current;
static long long allocations_done, fail_allocation_at, writes_done, fail_write_at, pinned_copies;
static long long frees_done, fail_free_at;
static int fail_write_now;
static long long live_allocations, registrations;

#define GUARD(expr)                   \
    do {                              \
        CUresult guard_status = expr; \
        if (guard_status != CUDA_SUCCESS) { \
            pthread_mutex_unlock(&lock); \
            return guard_status;      \
        }                             \
    } while (0)

/* Calls per driver entry point, for tests that count the driver work an operation makes
 * (`lazybuf_cuda_double_calls`). Every exported `cu*` function counts itself first, under its
 * own lock (some entry points run without `lock`). */
#define MAX_ENTRY_POINTS 64
static pthread_mutex_t calls_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *name;
    long long calls;
} entry_points[MAX_ENTRY_POINTS];

static void count_call(const char *name) {
    pthread_mutex_lock(&calls_lock);
    for (int i = 0; i < MAX_ENTRY_POINTS; i++) {
        if (entry_points[i].name == NULL) {
            entry_points[i].name = name;
        }
        if (entry_points[i].name == name || strcmp(entry_points[i].name, name) == 0) {
            entry_points[i].calls++;
            break;
        }
    }
    pthread_mutex_unlock(&calls_lock);
}

#define COUNTED count_call(__func__)

static long long env_number(const char *name, long long fallback) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') return fallback;
    char *end;
    long long n = strtoll(value, &end, 10);
    return *end == '\0' ? n : fallback;
}

/* Each check expects the lock held. */
static CUresult need_init(void) { return initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

static CUresult need_context(void) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return current != NULL && current->retained > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult check_device(CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult check_context(CUcontext ctx) {
    for (int i = 0; i < device_count; i++)
        if (ctx == &devices[i].ctx && ctx->retained > 0) return CUDA_SUCCESS;
    return CUDA_ERROR_INVALID_CONTEXT;
}

/* The device a stream belongs to; it must be the current context's device. */
static CUresult stream_device(CUstream stream, int *device) {
    CUresult status = need_context();
    if (status != CUDA_SUCCESS) return status;
    if (stream == NULL) {
        *device = current->device;
        return CUDA_SUCCESS;
    }
    for (CUstream s = streams; s != NULL; s = s->next) {
        if (s == stream) {
            if (s->device != current->device) return CUDA_ERROR_INVALID_CONTEXT;
            *device = s->device;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_HANDLE;
}

static struct allocation *find_allocation(const void *p) {
    for (struct allocation *a = allocations; a != NULL; a = a->next)
        if ((const char *)p >= a->base && (const char *)p < a->base + a->size) return a;
    return NULL;
}

/* [ptr, ptr + n) must lie in one allocation of `device` (-1: pinned host memory). */
static CUresult check_range(CUdeviceptr ptr, size_t n, int device) {
    struct allocation *a = find_allocation((const void *)(uintptr_t)ptr);
    if (a == NULL || a->device != device) return CUDA_ERROR_INVALID_VALUE;
    if (n > a->size - (size_t)((char *)(uintptr_t)ptr - a->base)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static int is_pinned(const void *p) {
    struct allocation *a = find_allocation(p);
    return a != NULL && a->device < 0;
}

static CUresult count_allocation(void) {
    allocations_done++;
    if (fail_allocation_at != 0 && allocations_done == fail_allocation_at) {
        fail_allocation_at = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Counts one device write: CUDA_SUCCESS, or the injected failure it must have. */
static CUresult count_write(void) {
    writes_done++;
    if (fail_write_at != 0 && writes_done == fail_write_at) {
        fail_write_at = 0;
        return fail_write_now ? CUDA_ERROR_UNKNOWN : CUDA_ERROR_LAUNCH_FAILED;
    }
    return CUDA_SUCCESS;
}

/* What a failing write leaves: garbage over the first half of its destination. */
static void scribble(char *dst, size_t n) { memset(dst, 0xA5, n / 2 + (n > 0)); }

/* Waits until no stream has work queued or running (the lock is held). */
static void drain_all(void) {
    for (;;) {
        int busy = 0;
        for (CUstream s = streams; s != NULL; s = s->next) busy |= s->head != NULL;
        if (!busy) return;
        pthread_cond_wait(&progress, &lock);
    }
}

/* The legacy NULL stream's implicit synchronization: waits until no blocking stream of
 * `device` has work queued or running (the lock is held). */
static void legacy_wait(int device) {
    for (;;) {
        int busy = 0;
        for (CUstream s = streams; s != NULL; s = s->next)
            busy |= s->blocking && s->device == device && s->head != NULL;
        if (!busy) return;
        pthread_cond_wait(&progress, &lock);
    }
}

static CUresult new_allocation(size_t size, int device, unsigned flags, void **out) {
    void *p = NULL;
    if (posix_memalign(&p, device < 0 ? 4096 : 256, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct allocation *a = malloc(sizeof *a);
    if (a == NULL) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Fresh memory is garbage, as on a GPU: reading it as data is a bug the tests must see. */
    memset(p, 0xCD, size);
    *a = (struct allocation){p, size, device, flags, 0, -2, allocations};
    allocations = a;
    live_allocations++;
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult free_allocation(const void *p, int device) {
    drain_all();
    for (struct allocation **link = &allocations; *link != NULL; link = &(*link)->next) {
        struct allocation *a = *link;
        if (a->base == p && a->device == device) {
            *link = a->next;
            if (device >= 0) devices[device].used -= a->size;
            if (device == -2) {
                registrations--;
            } else {
                live_allocations--;
                free(a->base);
            }
            free(a);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- Initialization, version, errors ---- */

EXPORT CUresult cuInit(unsigned flags) {
    COUNTED;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!initialized) {
        long long count = env_number("LAZYBUF_CUDA_DOUBLE_DEVICES", 2);
        if (count <= 0 || count > MAX_DEVICES) {
            pthread_mutex_unlock(&lock);
            return count <= 0 ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_INVALID_VALUE;
        }
        long long memory = env_number("LAZYBUF_CUDA_DOUBLE_MEMORY", 2LL << 30);
        device_count = (int)count;
        peer_allowed = env_number("LAZYBUF_CUDA_DOUBLE_PEER", 1) != 0;
        managed_level = (int)env_number("LAZYBUF_CUDA_DOUBLE_MANAGED", 2);
        for (int i = 0; i < device_count; i++) {
            devices[i] = (struct device){0};
            devices[i].ctx.device = i;
            devices[i].total = memory > 0 ? (size_t)memory : 0;
        }
        initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    COUNTED;
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    *version = 12080;
    return CUDA_SUCCESS;
}

static const char *error_name(CUresult error) {
    switch (error) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    }
    return NULL;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
    COUNTED;
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    *name = error_name(error);
    return *name != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
    COUNTED;
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    /* The double has no prose of its own: the name, marked as coming from the double. */
    static __thread char buffer[96];
    const char *name = error_name(error);
    if (name == NULL) {
        *text = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(buffer, sizeof buffer, "%s (lazybuf CUDA test double)", name);
    *text = buffer;
    return CUDA_SUCCESS;
}

/* ---- Devices ---- */

EXPORT CUresult cuDeviceGetCount(int *count) {
    COUNTED;
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    *count = device_count;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    COUNTED;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(ordinal));
    *device = ordinal;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    COUNTED;
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    snprintf(name, (size_t)len, "lazybuf CUDA test double #%d", dev);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    COUNTED;
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    *bytes = devices[dev].total;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    COUNTED;
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    pthread_mutex_unlock(&lock);
    switch (attribute) {
    case ATTR_INTEGRATED: *value = 0; return CUDA_SUCCESS;
    case ATTR_UNIFIED_ADDRESSING: *value = 1; return CUDA_SUCCESS;
    case ATTR_CC_MAJOR: *value = 8; return CUDA_SUCCESS;
    case ATTR_CC_MINOR: *value = 0; return CUDA_SUCCESS;
    case ATTR_MANAGED_MEMORY: *value = managed_level >= 1; return CUDA_SUCCESS;
    case ATTR_CONCURRENT_MANAGED_ACCESS: *value = managed_level >= 2; return CUDA_SUCCESS;
    }
    /* A real driver knows every attribute; the double only those lazybuf asks for. */
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    COUNTED;
    if (can == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    GUARD(check_device(peer));
    *can = peer_allowed && dev != peer;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* ---- Contexts ---- */

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    COUNTED;
    if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    devices[dev].ctx.retained++;
    *ctx = &devices[dev].ctx;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    if (devices[dev].ctx.retained == 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    devices[dev].ctx.retained--;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    if (ctx != NULL) GUARD(check_context(ctx));
    current = ctx;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    COUNTED;
    if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    *ctx = current;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    COUNTED;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    GUARD(check_context(peer));
    struct device *self = &devices[current->device];
    CUresult status = CUDA_SUCCESS;
    if (!peer_allowed || peer->device == current->device) {
        status = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    } else if (self->peer_enabled[peer->device]) {
        status = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    } else {
        self->peer_enabled[peer->device] = 1;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* ---- Streams and events: a worker thread per stream ---- */

static void release_event(CUevent e) {
    if (--e->refs == 0) free(e);
}

/* Runs one command's memory work (without the lock: its ranges stay allocated, because
 * freeing memory drains every stream first). */
static void execute(const struct command *c) {
    if (c->fail != CUDA_SUCCESS) {
        if (c->kind == CMD_COPY) scribble(c->dst, c->n);
        if (c->kind == CMD_MEMSET) scribble(c->dst, c->width * c->count);
        return;
    }
    if (c->kind == CMD_COPY) memmove(c->dst, c->src, c->n);
    if (c->kind == CMD_MEMSET && c->pitch == 0 && c->count > 0) {
        /* Packed: one unit, then what is filled copied onto what follows, doubling (a unit
           at a time took a quarter of a second for 40 MiB). */
        size_t total = c->width * c->count, done = c->width;
        memcpy(c->dst, c->value, c->width);
        while (done < total) {
            size_t n = done < total - done ? done : total - done;
            memcpy(c->dst + done, c->dst, n);
            done += n;
        }
    } else if (c->kind == CMD_MEMSET) {
        for (size_t i = 0; i < c->count; i++) memcpy(c->dst + i * c->pitch, c->value, c->width);
    }
}

static void *worker(void *arg) {
    CUstream s = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while ((s->head == NULL && !s->destroyed) || (s->head != NULL && holding)) pthread_cond_wait(&wake, &lock);
        if (s->head == NULL) break; /* destroyed and drained */
        struct command *c = s->head;
        if (c->kind == CMD_WAIT) {
            while (c->event->completed < c->target) pthread_cond_wait(&progress, &lock);
        } else if (c->kind != CMD_RECORD && c->kind != CMD_PREFETCH) {
            pthread_mutex_unlock(&lock);
            execute(c);
            pthread_mutex_lock(&lock);
        }
        if (c->fail != CUDA_SUCCESS) s->error = c->fail;
        if (c->kind == CMD_PREFETCH) c->range->location = c->location;
        if (c->kind == CMD_RECORD) {
            c->event->completed = c->target;
            c->event->status = s->error;
            s->error = CUDA_SUCCESS;
        }
        if (c->kind == CMD_RECORD || c->kind == CMD_WAIT) release_event(c->event);
        s->head = c->next;
        if (s->head == NULL) s->tail = NULL;
        free(c);
        pthread_cond_broadcast(&progress);
    }
    pthread_mutex_unlock(&lock);
    free(s);
    return NULL;
}

/* Appends a command to a stream (the lock is held). */
static CUresult enqueue(CUstream s, struct command c) {
    struct command *copy = malloc(sizeof *copy);
    if (copy == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *copy = c;
    copy->next = NULL;
    if (s->tail != NULL) s->tail->next = copy;
    else s->head = copy;
    s->tail = copy;
    pthread_cond_broadcast(&wake);
    return CUDA_SUCCESS;
}

/* Runs a write on `stream`: queued on a stream, at once on the legacy NULL stream. A failure
 * injected "now" fails the call itself. The lock is held. */
static CUresult submit(CUstream stream, struct command c) {
    c.fail = count_write();
    if (stream == NULL) legacy_wait(current->device);
    if (c.fail == CUDA_ERROR_UNKNOWN || stream == NULL) {
        execute(&c);
        return c.fail;
    }
    return enqueue(stream, c);
}

EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    COUNTED;
    if (stream == NULL || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    CUstream s = calloc(1, sizeof *s);
    if (s == NULL) GUARD(CUDA_ERROR_OUT_OF_MEMORY);
    s->device = current->device;
    s->blocking = flags == 0;
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, s) != 0) {
        free(s);
        GUARD(CUDA_ERROR_OUT_OF_MEMORY);
    }
    pthread_detach(thread);
    s->next = streams;
    streams = s;
    *stream = s;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    for (CUstream *link = &streams; *link != NULL; link = &(*link)->next) {
        if (*link == stream) {
            /* Its queued work still runs; the worker frees the stream when it is done. */
            *link = stream->next;
            stream->destroyed = 1;
            pthread_cond_broadcast(&wake);
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    CUresult status = CUDA_SUCCESS;
    if (stream != NULL) {
        while (stream->head != NULL) pthread_cond_wait(&progress, &lock);
        status = stream->error;
        stream->error = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult check_event(CUevent event) {
    for (CUevent e = events; e != NULL; e = e->next)
        if (e == event) return CUDA_SUCCESS;
    return CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventCreate(CUevent *event, unsigned flags) {
    COUNTED;
    if (event == NULL || flags > 15) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    CUevent e = calloc(1, sizeof *e);
    if (e == NULL) GUARD(CUDA_ERROR_OUT_OF_MEMORY);
    e->refs = 1;
    e->next = events;
    events = e;
    *event = e;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(check_event(event));
    GUARD(stream_device(stream, &device));
    unsigned long long target = ++event->recorded;
    if (stream == NULL) {
        legacy_wait(device);
        event->completed = target;
        event->status = CUDA_SUCCESS;
    } else {
        event->refs++;
        CUresult status = enqueue(stream, (struct command){.kind = CMD_RECORD, .event = event, .target = target});
        if (status != CUDA_SUCCESS) {
            event->refs--;
            event->recorded--;
            GUARD(status);
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent event) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    GUARD(check_event(event));
    CUresult status = event->completed < event->recorded ? CUDA_ERROR_NOT_READY : event->status;
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuEventSynchronize(CUevent event) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    GUARD(check_event(event));
    unsigned long long target = event->recorded;
    while (event->completed < target) pthread_cond_wait(&progress, &lock);
    CUresult status = event->status;
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
    COUNTED;
    int device;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_event(event));
    GUARD(stream_device(stream, &device));
    if (event->completed < event->recorded) {
        if (stream == NULL) {
            legacy_wait(device);
            unsigned long long target = event->recorded;
            while (event->completed < target) pthread_cond_wait(&progress, &lock);
        } else {
            event->refs++;
            struct command wait = {.kind = CMD_WAIT, .event = event, .target = event->recorded};
            CUresult status = enqueue(stream, wait);
            if (status != CUDA_SUCCESS) event->refs--;
            GUARD(status);
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent event) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    for (CUevent *link = &events; *link != NULL; link = &(*link)->next) {
        if (*link == event) {
            /* Queued commands naming it keep it until they have run. */
            *link = event->next;
            release_event(event);
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_HANDLE;
}

/* ---- Memory ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    COUNTED;
    if (ptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    struct device *d = &devices[current->device];
    GUARD(count_allocation());
    if (size > d->total - d->used) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p;
    GUARD(new_allocation(size, current->device, 0, &p));
    d->used += size;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *ptr, size_t size, unsigned flags) {
    COUNTED;
    if (ptr == NULL || size == 0 || (flags != MEM_ATTACH_GLOBAL && flags != MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    if (managed_level < 1) GUARD(CUDA_ERROR_NOT_SUPPORTED);
    struct device *d = &devices[current->device];
    GUARD(count_allocation());
    if (size > d->total - d->used) GUARD(CUDA_ERROR_OUT_OF_MEMORY);
    void *p;
    GUARD(new_allocation(size, current->device, flags, &p));
    allocations->managed = 1; /* new_allocation put it first */
    d->used += size;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr ptr, size_t count, CUdevice dst, CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (dst != DEVICE_CPU) GUARD(check_device(dst));
    if (managed_level < 2) GUARD(CUDA_ERROR_INVALID_DEVICE);
    struct allocation *a = find_allocation((const void *)(uintptr_t)ptr);
    if (a == NULL || !a->managed) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(ptr, count, a->device));
    if (stream == NULL) {
        legacy_wait(device);
        a->location = dst; /* the legacy stream: at once */
    }
    else GUARD(enqueue(stream, (struct command){.kind = CMD_PREFETCH, .range = a, .location = dst}));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    struct allocation *a = find_allocation((const void *)(uintptr_t)ptr);
    CUresult status = a != NULL && a->device >= 0 ? free_allocation(a->base, a->device)
                                                  : CUDA_ERROR_INVALID_VALUE;
    /* An injected failure: the memory is freed, and the call reports an earlier fault of the
     * context, as a real cuMemFree reports a sticky error. */
    frees_done++;
    if (status == CUDA_SUCCESS && fail_free_at != 0 && frees_done == fail_free_at) {
        fail_free_at = 0;
        status = CUDA_ERROR_LAUNCH_FAILED;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    COUNTED;
    if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    struct device *d = &devices[current->device];
    *free_bytes = d->total - d->used;
    *total = d->total;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void **ptr, size_t size, unsigned flags) {
    COUNTED;
    if (ptr == NULL || size == 0 || (flags & ~MEMHOSTALLOC_ALL_FLAGS) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    GUARD(count_allocation());
    GUARD(new_allocation(size, -1, flags, ptr));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *ptr) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    CUresult status = free_allocation(ptr, -1);
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuMemHostRegister_v2(void *ptr, size_t size, unsigned flags) {
    COUNTED;
    if (ptr == NULL || size == 0 || (flags & ~7u) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    for (struct allocation *a = allocations; a != NULL; a = a->next)
        if ((char *)ptr < a->base + a->size && a->base < (char *)ptr + size)
            GUARD(a->device == -2 ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED : CUDA_ERROR_INVALID_VALUE);
    struct allocation *a = malloc(sizeof *a);
    if (a == NULL) GUARD(CUDA_ERROR_OUT_OF_MEMORY);
    *a = (struct allocation){ptr, size, -2, flags, 0, -2, allocations};
    allocations = a;
    registrations++;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void *ptr) {
    COUNTED;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    struct allocation *a = find_allocation(ptr);
    if (a == NULL || a->device != -2 || a->base != (char *)ptr) GUARD(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CUresult status = free_allocation(ptr, -2);
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuMemHostGetFlags(unsigned *flags, void *ptr) {
    COUNTED;
    if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    struct allocation *a = find_allocation(ptr);
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    if (a != NULL && a->device == -1) {
        *flags = a->flags;
        status = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Only CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (9) and CU_POINTER_ATTRIBUTE_IS_MANAGED (8), the
 * attributes lazybuf asks; a pointer into no device allocation is CUDA_ERROR_INVALID_VALUE, as
 * the driver answers for memory it does not know. */
EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    COUNTED;
    if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    struct allocation *a = find_allocation((const void *)(uintptr_t)ptr);
    if (a == NULL || a->device < 0) GUARD(CUDA_ERROR_INVALID_VALUE);
    if (attribute == 9) *(int *)data = a->device;
    else if (attribute == 8) *(unsigned *)data = (unsigned)a->managed;
    else GUARD(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* ---- Copies and fills: checked at the call, run by the stream ---- */

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    if (src == NULL) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(dst, n, device));
    pinned_copies += is_pinned(src);
    GUARD(submit(stream, (struct command){.kind = CMD_COPY, .dst = (char *)(uintptr_t)dst, .src = src, .n = n}));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    if (dst == NULL) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(src, n, device));
    pinned_copies += is_pinned(dst);
    GUARD(submit(stream, (struct command){.kind = CMD_COPY, .dst = dst, .src = (const char *)(uintptr_t)src, .n = n}));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    GUARD(check_range(dst, n, device));
    GUARD(check_range(src, n, device));
    struct command c = {.kind = CMD_COPY, .dst = (char *)(uintptr_t)dst, .src = (const char *)(uintptr_t)src, .n = n};
    GUARD(submit(stream, c));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

#ifndef LAZYBUF_CUDA_DOUBLE_OLD_DRIVER /* the "old driver" build lacks this entry point */
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                  size_t n, CUstream stream) {
    COUNTED;
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    GUARD(check_context(dst_ctx));
    GUARD(check_context(src_ctx));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    GUARD(check_range(dst, n, dst_ctx->device));
    GUARD(check_range(src, n, src_ctx->device));
    struct command c = {.kind = CMD_COPY, .dst = (char *)(uintptr_t)dst, .src = (const char *)(uintptr_t)src, .n = n};
    GUARD(submit(stream, c));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

#endif

/* `height` rows of `width` units of `unit` bytes, rows `pitch` bytes apart (0: packed). */
static CUresult memset_2d(CUdeviceptr dst, const void *value, size_t unit, size_t pitch, size_t width, size_t height,
                          CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (width == 0 || height == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    size_t row = width * unit;
    if (dst % unit != 0 || width > SIZE_MAX / unit || (pitch != 0 && pitch < row)) GUARD(CUDA_ERROR_INVALID_VALUE);
    size_t span = pitch == 0 ? row * height : pitch * (height - 1) + row;
    if (pitch != 0 && height - 1 > (SIZE_MAX - row) / pitch) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(dst, span, device));
    struct command c = {.kind = CMD_MEMSET, .dst = (char *)(uintptr_t)dst};
    if (pitch == 0) {
        c.width = unit;
        c.count = width * height;
    } else {
        /* One unit per row here: lazybuf asks for nothing wider (width 1). */
        if (width != 1) GUARD(CUDA_ERROR_NOT_SUPPORTED);
        c.width = unit;
        c.count = height;
        c.pitch = pitch;
    }
    memcpy(c.value, value, unit);
    GUARD(submit(stream, c));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
    COUNTED;
    return memset_2d(dst, &value, 1, 0, count, 1, stream);
}

EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
    COUNTED;
    return memset_2d(dst, &value, 2, 0, count, 1, stream);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, CUstream stream) {
    COUNTED;
    return memset_2d(dst, &value, 4, 0, count, 1, stream);
}

EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned value, size_t width, size_t height,
                                   CUstream stream) {
    COUNTED;
    if (pitch == 0) return CUDA_ERROR_INVALID_VALUE;
    return memset_2d(dst, &value, 4, pitch, width, height, stream);
}

/* ---- Test hooks ---- */

EXPORT void lazybuf_cuda_double_fail_allocation(long long n) {
    pthread_mutex_lock(&lock);
    fail_allocation_at = n > 0 ? allocations_done + n : 0;
    pthread_mutex_unlock(&lock);
}

EXPORT void lazybuf_cuda_double_fail_free(long long n) {
    pthread_mutex_lock(&lock);
    fail_free_at = n > 0 ? frees_done + n : 0;
    pthread_mutex_unlock(&lock);
}

EXPORT void lazybuf_cuda_double_fail_copy(long long n) {
    pthread_mutex_lock(&lock);
    fail_write_at = n > 0 ? writes_done + n : 0;
    fail_write_now = 0;
    pthread_mutex_unlock(&lock);
}

EXPORT void lazybuf_cuda_double_fail_copy_now(long long n) {
    pthread_mutex_lock(&lock);
    fail_write_at = n > 0 ? writes_done + n : 0;
    fail_write_now = 1;
    pthread_mutex_unlock(&lock);
}

EXPORT void lazybuf_cuda_double_hold(long long on) {
    pthread_mutex_lock(&lock);
    holding = on != 0;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
}

EXPORT long long lazybuf_cuda_double_registrations(void) {
    pthread_mutex_lock(&lock);
    long long n = registrations;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT long long lazybuf_cuda_double_live_allocations(void) {
    pthread_mutex_lock(&lock);
    long long n = live_allocations;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT long long lazybuf_cuda_double_copies(void) {
    pthread_mutex_lock(&lock);
    long long n = writes_done;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT long long lazybuf_cuda_double_pinned_copies(void) {
    pthread_mutex_lock(&lock);
    long long n = pinned_copies;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT long long lazybuf_cuda_double_prefetch_location(CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    struct allocation *a = find_allocation((const void *)(uintptr_t)ptr);
    long long location = a != NULL && a->managed ? a->location : -3;
    pthread_mutex_unlock(&lock);
    return location;
}

/* Calls of the driver entry point `name` (e.g. "cuMemcpyHtoDAsync_v2") since the library was
 * loaded, or since the last `lazybuf_cuda_double_reset_calls`. */
EXPORT long long lazybuf_cuda_double_calls(const char *name) {
    long long n = 0;
    pthread_mutex_lock(&calls_lock);
    for (int i = 0; i < MAX_ENTRY_POINTS && entry_points[i].name != NULL; i++) {
        if (strcmp(entry_points[i].name, name) == 0) {
            n = entry_points[i].calls;
        }
    }
    pthread_mutex_unlock(&calls_lock);
    return n;
}

/* Writes the counted entry points as "name=calls" lines (those called at least once) into
 * `out` (at most `size` bytes, NUL-terminated); returns the length the whole list needs. */
EXPORT long long lazybuf_cuda_double_call_counts(char *out, long long size) {
    long long needed = 0;
    pthread_mutex_lock(&calls_lock);
    for (int i = 0; i < MAX_ENTRY_POINTS && entry_points[i].name != NULL; i++) {
        char line[128];
        int n = snprintf(line, sizeof line, "%s=%lld\n", entry_points[i].name, entry_points[i].calls);
        if (out != NULL && needed + n < size) {
            memcpy(out + needed, line, (size_t)n);
            out[needed + n] = 0;
        }
        needed += n;
    }
    pthread_mutex_unlock(&calls_lock);
    return needed;
}

/* Sets every entry point's call count to zero. */
EXPORT void lazybuf_cuda_double_reset_calls(void) {
    pthread_mutex_lock(&calls_lock);
    for (int i = 0; i < MAX_ENTRY_POINTS && entry_points[i].name != NULL; i++) {
        entry_points[i].calls = 0;
    }
    pthread_mutex_unlock(&calls_lock);
}
