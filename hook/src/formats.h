/* On-disk formats shared by libtessera (C) and the node daemon (Python,
 * tessera_node/budget/formats.py).  Little-endian, fixed-size records.  See hook/README.md.
 *
 * Budget file: written only by the daemon, in place (never truncated or replaced), mounted
 * read-only at TB_BUDGET_PATH.  A seqlock generation counter makes a torn read detectable:
 * the writer makes it odd, writes, then makes it even again.
 *
 * Ledger: created and initialised by the node daemon before the container starts, mounted
 * writable (the file alone) at TB_LEDGER_PATH, shared by all the container's processes
 * through mmap; the budget file names it (device and inode), so a process never uses another
 * file there.  Without a daemon (the environment fallback) the first process creates it.
 */
#ifndef TESSERA_FORMATS_H
#define TESSERA_FORMATS_H

#include <stdint.h>

#define TB_BUDGET_PATH "/run/tessera/budget"
#define TB_LEDGER_PATH "/run/tessera/ledger"
/* Mounted read-only by tessera's device plugin into every container it sets up: there, a
 * missing budget file refuses device memory (no environment fallback). */
#define TB_MARKER_PATH "/run/tessera/managed"
/* Where the device plugin mounts the library (ld.so.preload names it): loaded from there, the
 * library is managed as under the marker, whatever covers /run/tessera. */
#define TB_LIB_PATH "/usr/local/lib/tessera/libtessera.so"

#define TB_MAX_DEV 16

/* ---- budget file, version 1 ---- */
#define TB_MAGIC 0x47444254u /* bytes "TBDG" */
#define TB_VERSION 1u
#define TB_FILE_SIZE 4096u

#define TB_DEV_MEM_LIMIT 0x1u  /* mem_limit applies (otherwise: no memory limit) */
#define TB_DEV_CORE_LIMIT 0x2u /* rate/burst apply (otherwise: launches are not throttled) */
#define TB_DEV_UUID 0x4u       /* match the device by uuid, not by index */
#define TB_DEV_MIG 0x8u        /* with TB_DEV_UUID: the uuid is a MIG device's ("MIG-..."), not a
                                  GPU's ("GPU-..."); the 16 bytes alone do not say which */
#define TB_DEV_FLAGS (TB_DEV_MEM_LIMIT | TB_DEV_CORE_LIMIT | TB_DEV_UUID | TB_DEV_MIG)

/* Header flags: the state of the whole file.  Neither: ready (the entries are the budget).
 * PENDING and REFUSED files name no device (ndev = 0), so a hook that predates the flags
 * finds no device in the budget and refuses device memory too (the version-skew rule). */
#define TB_PENDING 0x1u /* the daemon does not know the container's pod yet: wait wait_ms */
#define TB_REFUSED 0x2u /* no device memory for this container; why: text at TB_REASON_OFF */
#define TB_HDR_FLAGS (TB_PENDING | TB_REFUSED)
#define TB_WAIT_MAX_MS 120000u /* a PENDING file's wait_ms is capped at this */
#define TB_REASON_OFF 3840u    /* REFUSED: NUL-terminated reason, at most TB_REASON_LEN bytes */
#define TB_REASON_LEN 256u

struct tb_file_header {   /* 64 bytes */
    uint32_t magic;       /*  0 TB_MAGIC */
    uint32_t version;     /*  4 TB_VERSION */
    uint64_t generation;  /*  8 seqlock: odd while being written, +2 per update */
    uint32_t header_size; /* 16 sizeof(struct tb_file_header) */
    uint32_t entry_size;  /* 20 sizeof(struct tb_file_dev) */
    uint32_t ndev;        /* 24 entries that follow the header, <= TB_MAX_DEV */
    uint32_t flags;       /* 28 TB_PENDING / TB_REFUSED, else 0 (ready) */
    uint32_t wait_ms;     /* 32 PENDING: how long a process waits on its first GPU call */
    uint32_t reserved0;   /* 36 */
    uint64_t ledger_dev;  /* 40 the ledger the node daemon created for this container: its */
    uint64_t ledger_ino;  /* 48 device and inode (st_dev, st_ino); 0: none (the library
                             creates one, as before the daemon did) */
    uint64_t reserved1;   /* 56 */
};

struct tb_file_dev {      /* 64 bytes */
    uint8_t uuid[16];     /*  0 CUDA/NVML UUID bytes of the GPU or MIG instance */
    uint32_t index;       /* 16 CUDA ordinal inside the container (when !TB_DEV_UUID) */
    uint32_t flags;       /* 20 TB_DEV_* */
    uint64_t mem_limit;   /* 24 bytes */
    uint32_t core_target; /* 32 core budget in hundredths of a percent (informational) */
    uint32_t reserved0;   /* 36 */
    uint64_t rate_milli;  /* 40 launch tokens per second x 1000, set by the controller */
    uint64_t burst_milli; /* 48 bucket depth in tokens x 1000 */
    uint64_t context_bytes; /* 56 device bytes one context holds (the daemon measures it):
                               charged for every context a process creates; 0: nothing */
};

_Static_assert(sizeof(struct tb_file_header) == 64, "budget header layout");
_Static_assert(sizeof(struct tb_file_dev) == 64, "budget entry layout");

/* ---- ledger, version 1 ---- */
#define TL_MAGIC 0x474c5354u /* bytes "TSLG" */
#define TL_VERSION 1u
#define TL_NSLOTS 1024u
#define TL_HEADER_SIZE 4096u
#define TL_LOCK_BASE (1ll << 40) /* OFD lock byte of slot i: TL_LOCK_BASE + i */

struct tl_dev {             /* 64 bytes, per budget entry */
    uint64_t used;          /*  0 bytes held by all processes (== sum of slot bytes) */
    uint64_t tat_ns;        /*  8 token bucket (GCRA): theoretical arrival time, CLOCK_MONOTONIC */
    uint64_t tokens_milli;  /* 16 tokens taken from the bucket, x1000 (monotonic) */
    uint64_t launches;      /* 24 kernels launched (monotonic) */
    uint64_t wait_ns;       /* 32 total time launches waited for tokens */
    uint64_t waits;         /* 40 number of waits */
    uint64_t oom;           /* 48 allocations refused for budget */
    uint64_t reserved;      /* 56 */
};

struct tl_header {
    uint32_t magic;        /*   0 TL_MAGIC, written last by the creator */
    uint32_t version;      /*   4 */
    uint32_t nslots;       /*   8 */
    uint32_t ndev;         /*  12 TB_MAX_DEV */
    uint32_t header_size;  /*  16 TL_HEADER_SIZE */
    uint32_t slot_size;    /*  20 sizeof(struct tl_slot) */
    uint32_t hwm;          /*  24 slots [0, hwm) have been used */
    uint32_t slot_changes; /*  28 bumped after every join and every reclaim (0: a library
                                  older than the counter): readers that keep the slot table
                                  decoded scan it again only when it moves */
    uint64_t launches_gone; /* 32 kernels launched by processes whose slots were reclaimed
                                  (each slot counts its own process's at 144): with the
                                  live slots' counts, the container's launches so far */
    uint64_t reserved1[3]; /*  40 */
    uint64_t lock;         /*  64 0: free, else (owner slot + 1) << 32 | owner slot gen;
                                  guards used[] and slot bytes; stolen from a dead owner */
    uint8_t lock_pad[56];  /*  72 */
    struct tl_dev dev[TB_MAX_DEV]; /* 128 */
    /* 1152: launch waits per device, log2 buckets: bucket b counts waits of [2^(b-1), 2^b)
     * microseconds (b = 0: under 1 us; 31: everything longer) -- p99 waiting per container */
    uint32_t wait_hist[TB_MAX_DEV][32];
};

struct tl_slot {                 /* 256 bytes */
    int32_t pid;                 /*   0 owner (pid in the container), 0: free */
    uint32_t gen;                /*   4 bumped by every new owner */
    uint64_t joined_ns;          /*   8 CLOCK_REALTIME ns when joined */
    uint64_t bytes[TB_MAX_DEV];  /*  16 device bytes this process holds */
    uint64_t launches;           /* 144 kernels this process launched (a graph: its kernels),
                                    written by it alone, read by the node daemon as the
                                    container's activity */
    uint64_t wait_ns;            /* 152 */
    uint64_t start_ticks;        /* 160 /proc/self/stat starttime: the same in every PID
                                    namespace, so the host can find this process */
    uint64_t pidns;              /* 168 inode of /proc/self/ns/pid (0: unknown): two
                                    containers' PID 1 may start in the same clock tick, so
                                    pid and start time alone can name two processes */
    uint64_t reserved1[10];      /* 176 */
};

_Static_assert(sizeof(struct tl_header) <= TL_HEADER_SIZE, "ledger header fits");
_Static_assert(__builtin_offsetof(struct tl_header, dev) == 128, "ledger header layout");
_Static_assert(__builtin_offsetof(struct tl_header, wait_hist) == 1152, "ledger header layout");
_Static_assert(sizeof(struct tl_slot) == 256, "ledger slot layout");

#define TL_FILE_SIZE (TL_HEADER_SIZE + TL_NSLOTS * 256u)

#endif
