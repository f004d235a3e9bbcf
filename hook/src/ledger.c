/* Ledger: one file per container, mapped by every process of the container.
 *
 * Device bytes: used[dev] == sum of slot bytes[dev], both changed together under a
 * lock word (one CAS) that is never held across a driver call.  A holder killed inside the
 * critical section is recognised by a waiter (its slot changed owner or its OFD slot lock
 * is gone), which takes the lock over and recomputes used[] from the slots: nothing can
 * stay locked and no byte can be lost.
 * Slots: slot i is owned by whoever holds the OFD write lock on byte TL_LOCK_BASE + i of
 * the file; the kernel drops it when the owner dies, so a dead process is recognised
 * without /proc and its bytes are reclaimed by whoever next takes that lock.
 */
#define _GNU_SOURCE
#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void (*tl_on_map)(void *base);

static void *map_ledger(int fd)
{
    void *m = mmap(NULL, TL_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED && tl_on_map)
        tl_on_map(m);
    return m;
}

static void unmap_ledger(void *m)
{
    if (tl_on_map)
        tl_on_map(NULL);
    munmap(m, TL_FILE_SIZE);
}

int tl_validate(const void *map, size_t len, const char **why)
{
    const struct tl_header *h = map;
    if (!map || len < TL_FILE_SIZE) {
        *why = "ledger too short";
        return -1;
    }
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != TL_MAGIC) {
        *why = "ledger has a bad magic";
        return -1;
    }
    if (h->version != TL_VERSION || h->nslots != TL_NSLOTS || h->ndev != TB_MAX_DEV ||
        h->header_size != TL_HEADER_SIZE || h->slot_size != sizeof(struct tl_slot)) {
        *why = "ledger has an unsupported layout";
        return -1;
    }
    return 0;
}

static int lock_slot(int fd, int i, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = TL_LOCK_BASE + i;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

static void recount(struct tl_header *h, struct tl_slot *slots)
{
    for (int d = 0; d < TB_MAX_DEV; d++) {
        uint64_t sum = 0;
        for (uint32_t i = 0; i < TL_NSLOTS; i++)
            sum += slots[i].bytes[d];
        __atomic_store_n(&h->dev[d].used, sum, __ATOMIC_RELAXED);
    }
}

static int owner_alive(struct tl *l, uint64_t w)
{
    uint32_t slot = (uint32_t)(w >> 32) - 1, gen = (uint32_t)w;
    if (slot >= TL_NSLOTS)
        return 0;
    if (__atomic_load_n(&l->slots[slot].gen, __ATOMIC_ACQUIRE) != gen)
        return 0;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = TL_LOCK_BASE + slot;
    fl.l_len = 1;
    if (fcntl(l->fd, F_OFD_GETLK, &fl))
        return 1; /* cannot tell: assume alive */
    return fl.l_type != F_UNLCK;
}

static uint64_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

/* The ledger lock: one CAS when free.  A waiter that finds the holder dead (its slot has a
 * new owner or nobody holds the slot's OFD lock) takes the lock over and recounts used[]
 * from the slots, so a SIGKILL inside the critical section loses nothing.  The lock is held
 * for a few hundred instructions; one held by a live process for seconds is a lock word the
 * container wrote: the ledger is then unusable (-1), never a hang. */
static __attribute__((noinline)) int mlock_slow(struct tl *l, uint64_t want)
{
    uint64_t w, give_up = 0;
    for (unsigned spins = 1;; spins++) {
        w = __atomic_load_n(&l->h->lock, __ATOMIC_RELAXED);
        if (w == 0) {
            if (__atomic_compare_exchange_n(&l->h->lock, &w, want, 0, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED))
                return 0;
            continue;
        }
        if (spins % 256 == 0) {
            if (!owner_alive(l, w)) {
                if (__atomic_compare_exchange_n(&l->h->lock, &w, want, 0, __ATOMIC_ACQUIRE,
                                                __ATOMIC_RELAXED)) {
                    recount(l->h, l->slots);
                    return 0;
                }
            } else if (!give_up) {
                give_up = mono_s() + 3;
            } else if (mono_s() >= give_up) {
                return -1;
            }
        }
        if (spins > 64)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
}

static inline int mlock_(struct tl *l)
{
    if (!l->self)
        return -1;
    uint64_t want = ((uint64_t)(l->slot + 1) << 32) | l->self->gen, w = 0;
    if (__atomic_compare_exchange_n(&l->h->lock, &w, want, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return 0;
    return mlock_slow(l, want);
}

static void munlock_(struct tl *l)
{
    __atomic_store_n(&l->h->lock, 0, __ATOMIC_RELEASE);
}

static int init_locked(struct tl_header *h)
{
    memset((void *)h, 0, TL_HEADER_SIZE);
    h->version = TL_VERSION;
    h->nslots = TL_NSLOTS;
    h->ndev = TB_MAX_DEV;
    h->header_size = TL_HEADER_SIZE;
    h->slot_size = sizeof(struct tl_slot);
    __atomic_store_n(&h->magic, TL_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* The daemon's ledger: exactly the file the budget names, mapped as it is. */
static void *open_named(int fd, uint64_t want_dev, uint64_t want_ino, const char **why)
{
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        *why = "ledger is not a regular file";
        return NULL;
    }
    if ((uint64_t)st.st_dev != want_dev || (uint64_t)st.st_ino != want_ino) {
        *why = "ledger is not the one the node daemon created";
        return NULL;
    }
    if ((size_t)st.st_size != TL_FILE_SIZE) {
        *why = "ledger has the wrong size";
        return NULL;
    }
    void *m = map_ledger(fd);
    if (m == MAP_FAILED) {
        *why = "cannot map the ledger";
        return NULL;
    }
    return m;
}

int tl_open(struct tl *l, const char *path, uint64_t want_dev, uint64_t want_ino,
            const char **why)
{
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->slot = -1;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (want_ino ? 0 : O_CREAT),
                  0660);
    if (fd < 0) {
        *why = "cannot open the ledger";
        return -1;
    }
    if (want_ino) {
        void *m = open_named(fd, want_dev, want_ino, why);
        if (!m || tl_validate(m, TL_FILE_SIZE, why)) {
            if (m)
                unmap_ledger(m);
            close(fd);
            return -1;
        }
        l->fd = fd;
        l->h = m;
        l->slots = (struct tl_slot *)((char *)m + TL_HEADER_SIZE);
        return 0;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        *why = "ledger is not a regular file";
        return -1;
    }
    int locked = 0;
    if ((size_t)st.st_size < TL_FILE_SIZE) {
        if (flock(fd, LOCK_EX)) {
            close(fd);
            *why = "cannot lock the ledger";
            return -1;
        }
        locked = 1;
        if (fstat(fd, &st) || ((size_t)st.st_size < TL_FILE_SIZE && ftruncate(fd, TL_FILE_SIZE))) {
            flock(fd, LOCK_UN);
            close(fd);
            *why = "cannot size the ledger";
            return -1;
        }
    }
    void *m = map_ledger(fd);
    if (m == MAP_FAILED) {
        if (locked)
            flock(fd, LOCK_UN);
        close(fd);
        *why = "cannot map the ledger";
        return -1;
    }
    struct tl_header *h = m;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != TL_MAGIC) {
        if (!locked && flock(fd, LOCK_EX) == 0)
            locked = 1;
        if (locked && __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == 0) {
            /* a fresh file: all zero */
            int zero = 1;
            for (size_t i = 0; i < TL_HEADER_SIZE && zero; i++)
                zero = ((unsigned char *)m)[i] == 0 || i >= 64;
            if (zero && init_locked(h)) {
                flock(fd, LOCK_UN);
                unmap_ledger(m);
                close(fd);
                *why = "cannot initialise the ledger";
                return -1;
            }
        }
    }
    if (locked)
        flock(fd, LOCK_UN);
    if (tl_validate(m, TL_FILE_SIZE, why)) {
        unmap_ledger(m);
        close(fd);
        return -1;
    }
    l->fd = fd;
    l->h = h;
    l->slots = (struct tl_slot *)((char *)m + TL_HEADER_SIZE);
    return 0;
}

/* Give a slot whose owner is gone (we hold its OFD lock) back: its bytes leave used[]. */
static int reclaim(struct tl *l, struct tl_slot *s)
{
    int any = 0;
    for (int d = 0; d < TB_MAX_DEV; d++)
        any |= s->bytes[d] != 0;
    if (any) {
        if (mlock_(l))
            return -1;
        for (int d = 0; d < TB_MAX_DEV; d++) {
            uint64_t b = s->bytes[d], u = l->h->dev[d].used;
            __atomic_store_n(&l->h->dev[d].used, u >= b ? u - b : 0, __ATOMIC_RELAXED);
            s->bytes[d] = 0;
        }
        munlock_(l);
    }
    uint64_t launched = __atomic_exchange_n(&s->launches, 0, __ATOMIC_RELAXED);
    __atomic_fetch_add(&l->h->launches_gone, launched, __ATOMIC_RELAXED);
    s->wait_ns = 0;
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
    __atomic_fetch_add(&l->h->slot_changes, 1, __ATOMIC_RELEASE);
    return 0;
}

/* The inode of this process's PID namespace (what the host sees at /proc/<pid>/ns/pid). */
static uint64_t pid_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Field 22 of /proc/self/stat (process start time in clock ticks since boot). */
static uint64_t start_ticks(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    for (int field = 3; field < 22 && p; field++) { /* p: the space before field 3 */
        p = strchr(p + 1, ' ');
    }
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

int tl_join(struct tl *l, const char **why)
{
    if (l->self)
        return 0;
    pid_t pid = getpid();
    uint32_t start = (uint32_t)pid % TL_NSLOTS;
    for (uint32_t k = 0; k < TL_NSLOTS; k++) {
        int i = (int)((start + k) % TL_NSLOTS);
        if (lock_slot(l->fd, i, F_WRLCK))
            continue;
        struct tl_slot *s = &l->slots[i];
        __atomic_fetch_add(&s->gen, 1, __ATOMIC_ACQ_REL);
        l->slot = i;
        l->self = s;
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0 && reclaim(l, s)) {
            l->slot = -1;
            l->self = NULL;
            lock_slot(l->fd, i, F_UNLCK);
            *why = "ledger lock unusable";
            return -1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->joined_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        s->start_ticks = start_ticks();
        s->pidns = pid_namespace();
        __atomic_store_n(&s->pid, (int32_t)pid, __ATOMIC_RELEASE);
        __atomic_fetch_add(&l->h->slot_changes, 1, __ATOMIC_RELEASE);
        uint32_t hwm = __atomic_load_n(&l->h->hwm, __ATOMIC_RELAXED);
        while (hwm < (uint32_t)i + 1 &&
               !__atomic_compare_exchange_n(&l->h->hwm, &hwm, (uint32_t)i + 1, 1,
                                            __ATOMIC_RELEASE, __ATOMIC_RELAXED))
            ;
        return 0;
    }
    *why = "ledger full";
    return -1;
}

void tl_forget(struct tl *l)
{
    if (l->h)
        unmap_ledger(l->h);
    if (l->fd >= 0)
        close(l->fd);
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->slot = -1;
}

int tl_reserve(struct tl *l, int dev, uint64_t bytes, uint64_t limit)
{
    if (!l->self || dev < 0 || dev >= TB_MAX_DEV)
        return -1;
    if (mlock_(l))
        return -1;
    struct tl_dev *d = &l->h->dev[dev];
    uint64_t u = d->used, mine = __atomic_load_n(&l->own[dev], __ATOMIC_RELAXED);
    if (__builtin_expect(u < mine || l->h->magic != TL_MAGIC, 0)) {
        /* the shared count is below what this process holds itself, or the header is gone:
         * the container wrote its ledger, and no process of it can trust it any more */
        munlock_(l);
        return -1;
    }
    if (bytes > limit || u > limit - bytes) {
        munlock_(l);
        __atomic_fetch_add(&d->oom, 1, __ATOMIC_RELAXED);
        return 1;
    }
    __atomic_store_n(&d->used, u + bytes, __ATOMIC_RELAXED);
    mine += bytes; /* the slot says what we hold, from our own count */
    l->self->bytes[dev] = mine;
    __atomic_store_n(&l->own[dev], mine, __ATOMIC_RELAXED);
    munlock_(l);
    return 0;
}

void tl_release(struct tl *l, int dev, uint64_t bytes)
{
    if (!l->self || dev < 0 || dev >= TB_MAX_DEV || mlock_(l))
        return;
    struct tl_dev *d = &l->h->dev[dev];
    /* never more than this process reserved: every release is of a record it made */
    uint64_t mine = __atomic_load_n(&l->own[dev], __ATOMIC_RELAXED) - bytes;
    __atomic_store_n(&l->own[dev], mine, __ATOMIC_RELAXED);
    l->self->bytes[dev] = mine;
    uint64_t u = d->used;
    __atomic_store_n(&d->used, u >= bytes ? u - bytes : 0, __ATOMIC_RELAXED);
    munlock_(l);
}

int tl_reap(struct tl *l)
{
    int n = 0;
    uint32_t hwm = __atomic_load_n(&l->h->hwm, __ATOMIC_ACQUIRE);
    if (hwm > TL_NSLOTS)
        hwm = TL_NSLOTS;
    for (uint32_t i = 0; i < hwm; i++) {
        if ((int)i == l->slot)
            continue;
        struct tl_slot *s = &l->slots[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == 0)
            continue;
        if (lock_slot(l->fd, (int)i, F_WRLCK))
            continue; /* owner alive */
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0 && reclaim(l, s) == 0)
            n++;
        lock_slot(l->fd, (int)i, F_UNLCK);
    }
    return n;
}
