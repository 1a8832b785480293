/*
 * TEST DOUBLE of the CUDA driver API (libcuda), for lazybuf's tests. NOT a CUDA driver.
 *
 * It implements, over ordinary host memory, exactly the driver entry points lazybuf's CUDA
 * backend calls, with the real signatures and CUresult codes, so the backend's code paths run
 * on machines without a GPU. Device pointers are host allocations; streams run every copy
 * immediately; events are complete as soon as they are recorded. It checks what a driver
 * checks (initialization, a current context on the calling thread, handles, bounds of device
 * ranges) and answers with the driver's error codes, so backend bugs show up as errors.
 *
 * Configuration (read once, by cuInit):
 *   LAZYBUF_CUDA_DOUBLE_DEVICES  number of devices, 0..8 (default 2; 0: cuInit fails with
 *                                CUDA_ERROR_NO_DEVICE, like a driver without a GPU)
 *   LAZYBUF_CUDA_DOUBLE_PEER     1 (default): devices can access each other (peer copies);
 *                                0: cuDeviceCanAccessPeer says no
 *   LAZYBUF_CUDA_DOUBLE_MEMORY   bytes of memory per device (default 2 GiB)
 *
 * Built with -DLAZYBUF_CUDA_DOUBLE_OLD_DRIVER it lacks cuMemcpyPeerAsync, like a driver too old
 * for the backend, which must then report CUDA unavailable instead of panicking.
 *
 * Test hooks (exported; reach them with dlopen(RTLD_NOLOAD) + dlsym):
 *   lazybuf_cuda_double_fail_allocation(n)  the n-th allocation from now (cuMemAlloc,
 *                                           cuMemHostAlloc) fails with OUT_OF_MEMORY; 0 disarms
 *   lazybuf_cuda_double_fail_copy(n)        the n-th device write from now (any memcpy or
 *                                           memset) writes garbage over the first half of its
 *                                           destination and fails with CUDA_ERROR_UNKNOWN,
 *                                           like a runtime dying half-way; 0 disarms
 *   lazybuf_cuda_double_live_allocations()  device and pinned host allocations not yet freed
 *   lazybuf_cuda_double_copies()            device writes done so far (memcpy and memset)
 *   lazybuf_cuda_double_pinned_copies()     host<->device copies whose host side was pinned
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
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

/* Attribute and flag values from cuda.h. */
enum { ATTR_INTEGRATED = 18, ATTR_UNIFIED_ADDRESSING = 41, ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76 };
enum { MEMHOSTALLOC_ALL_FLAGS = 1 | 2 | 4 };

typedef struct CUctx_st {
    int device;
    int retained;
} *CUcontext;

typedef struct CUstream_st {
    int device;
    struct CUstream_st *next;
} *CUstream;

typedef struct CUevent_st {
    struct CUevent_st *next;
} *CUevent;

struct allocation {
    char *base;
    size_t size;
    int device; /* -1: pinned host memory */
    unsigned flags;
    struct allocation *next;
};

struct device {
    struct CUctx_st ctx;
    size_t total, used;
    int peer_enabled[MAX_DEVICES];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized, device_count, peer_allowed;
static struct device devices[MAX_DEVICES];
static struct allocation *allocations;
static CUstream streams;
static CUevent events;
static __thread CUcontext current;
static long long allocations_done, fail_allocation_at, writes_done, fail_write_at, pinned_copies;
static long long live_allocations;

#define GUARD(expr)                   \
    do {                              \
        CUresult guard_status = expr; \
        if (guard_status != CUDA_SUCCESS) { \
            pthread_mutex_unlock(&lock); \
            return guard_status;      \
        }                             \
    } while (0)

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
    return a != NULL && a->device == -1;
}

static CUresult count_allocation(void) {
    allocations_done++;
    if (fail_allocation_at != 0 && allocations_done == fail_allocation_at) {
        fail_allocation_at = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Counts one device write; on an injected failure scribbles over half of `dst` first. */
static CUresult count_write(void *dst, size_t n) {
    writes_done++;
    if (fail_write_at != 0 && writes_done == fail_write_at) {
        fail_write_at = 0;
        memset(dst, 0xA5, n / 2 + (n > 0));
        return CUDA_ERROR_UNKNOWN;
    }
    return CUDA_SUCCESS;
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
    *a = (struct allocation){p, size, device, flags, allocations};
    allocations = a;
    live_allocations++;
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult free_allocation(const void *p, int device) {
    for (struct allocation **link = &allocations; *link != NULL; link = &(*link)->next) {
        struct allocation *a = *link;
        if (a->base == p && a->device == device) {
            *link = a->next;
            if (device >= 0) devices[device].used -= a->size;
            live_allocations--;
            free(a->base);
            free(a);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- Initialization, version, errors ---- */

EXPORT CUresult cuInit(unsigned flags) {
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
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    }
    return NULL;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    *name = error_name(error);
    return *name != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
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
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    *count = device_count;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(ordinal));
    *device = ordinal;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    snprintf(name, (size_t)len, "lazybuf CUDA test double #%d", dev);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    *bytes = devices[dev].total;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    pthread_mutex_unlock(&lock);
    switch (attribute) {
    case ATTR_INTEGRATED: *value = 0; return CUDA_SUCCESS;
    case ATTR_UNIFIED_ADDRESSING: *value = 1; return CUDA_SUCCESS;
    case ATTR_CC_MAJOR: *value = 8; return CUDA_SUCCESS;
    case ATTR_CC_MINOR: *value = 0; return CUDA_SUCCESS;
    }
    /* A real driver knows every attribute; the double only those lazybuf asks for. */
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
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
    if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(check_device(dev));
    devices[dev].ctx.retained++;
    *ctx = &devices[dev].ctx;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
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
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    if (ctx != NULL) GUARD(check_context(ctx));
    current = ctx;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    *ctx = current;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
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

/* ---- Streams and events: work runs at once, so both are always complete ---- */

EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    if (stream == NULL || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    CUstream s = malloc(sizeof *s);
    if (s == NULL) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *s = (struct CUstream_st){current->device, streams};
    streams = s;
    *stream = s;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    for (CUstream *link = &streams; *link != NULL; link = &(*link)->next) {
        if (*link == stream) {
            *link = stream->next;
            free(stream);
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult check_event(CUevent event) {
    for (CUevent e = events; e != NULL; e = e->next)
        if (e == event) return CUDA_SUCCESS;
    return CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuEventCreate(CUevent *event, unsigned flags) {
    if (event == NULL || flags > 15) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    CUevent e = malloc(sizeof *e);
    if (e == NULL) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->next = events;
    events = e;
    *event = e;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(check_event(event));
    GUARD(stream_device(stream, &device));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent event) {
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    GUARD(check_event(event));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent event) {
    pthread_mutex_lock(&lock);
    GUARD(need_init());
    for (CUevent *link = &events; *link != NULL; link = &(*link)->next) {
        if (*link == event) {
            *link = event->next;
            free(event);
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_HANDLE;
}

/* ---- Memory ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
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

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    struct allocation *a = find_allocation((const void *)(uintptr_t)ptr);
    CUresult status = a != NULL && a->device >= 0 ? free_allocation(a->base, a->device)
                                                  : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
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
    if (ptr == NULL || size == 0 || (flags & ~MEMHOSTALLOC_ALL_FLAGS) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    GUARD(count_allocation());
    GUARD(new_allocation(size, -1, flags, ptr));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *ptr) {
    pthread_mutex_lock(&lock);
    GUARD(need_context());
    CUresult status = free_allocation(ptr, -1);
    pthread_mutex_unlock(&lock);
    return status;
}

EXPORT CUresult cuMemHostGetFlags(unsigned *flags, void *ptr) {
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

/* ---- Copies and fills, run at once on the calling thread ---- */

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    if (src == NULL) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(dst, n, device));
    GUARD(count_write((void *)(uintptr_t)dst, n));
    pinned_copies += is_pinned(src);
    memcpy((void *)(uintptr_t)dst, src, n);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    if (dst == NULL) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(src, n, device));
    GUARD(count_write(dst, n));
    pinned_copies += is_pinned(dst);
    memcpy(dst, (const void *)(uintptr_t)src, n);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    GUARD(check_range(dst, n, device));
    GUARD(check_range(src, n, device));
    GUARD(count_write((void *)(uintptr_t)dst, n));
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

#ifndef LAZYBUF_CUDA_DOUBLE_OLD_DRIVER /* the "old driver" build lacks this entry point */
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                  size_t n, CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    GUARD(check_context(dst_ctx));
    GUARD(check_context(src_ctx));
    if (n == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    GUARD(check_range(dst, n, dst_ctx->device));
    GUARD(check_range(src, n, src_ctx->device));
    GUARD(count_write((void *)(uintptr_t)dst, n));
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

#endif

static CUresult memset_n(CUdeviceptr dst, const void *value, size_t width, size_t count, CUstream stream) {
    int device;
    pthread_mutex_lock(&lock);
    GUARD(stream_device(stream, &device));
    if (count == 0) return pthread_mutex_unlock(&lock), CUDA_SUCCESS;
    if (dst % width != 0 || count > SIZE_MAX / width) GUARD(CUDA_ERROR_INVALID_VALUE);
    GUARD(check_range(dst, count * width, device));
    GUARD(count_write((void *)(uintptr_t)dst, count * width));
    char *p = (char *)(uintptr_t)dst;
    for (size_t i = 0; i < count; i++) memcpy(p + i * width, value, width);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
    return memset_n(dst, &value, 1, count, stream);
}

EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
    return memset_n(dst, &value, 2, count, stream);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, CUstream stream) {
    return memset_n(dst, &value, 4, count, stream);
}

/* ---- Test hooks ---- */

EXPORT void lazybuf_cuda_double_fail_allocation(long long n) {
    pthread_mutex_lock(&lock);
    fail_allocation_at = n > 0 ? allocations_done + n : 0;
    pthread_mutex_unlock(&lock);
}

EXPORT void lazybuf_cuda_double_fail_copy(long long n) {
    pthread_mutex_lock(&lock);
    fail_write_at = n > 0 ? writes_done + n : 0;
    pthread_mutex_unlock(&lock);
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
