/* The node's device files, and which GPUs and MIG devices a process may see through them.
 *
 * As the NVIDIA driver does, the simulated node has one device file per GPU,
 * `dev/nvidia<minor>`, and one per MIG capability a container needs,
 * `dev/nvidia-caps/nvidia-cap<N>` (a GPU instance's `access`, a compute instance's `access`),
 * with the capabilities' minors listed in `proc/driver/nvidia-caps/mig-minors` in the
 * driver's format; all below the directory of the node's state file (the node's root).
 * A GPU's files appear when the node starts, a capability's when its instance is created.
 *
 * A container gets only the files of what it was allocated, in a directory named by
 * TESSERA_SIM_DEV.  With it set, both libraries see only the GPUs whose nvidia<minor> is
 * there, re-indexed from 0, and on a MIG-enabled GPU only the MIG devices whose GPU-instance
 * and compute-instance access capabilities are there: what real NVML and CUDA see through a
 * container's device nodes.  Unset (the host) everything is visible.  README.md, "Device
 * files and visibility". */
#define _GNU_SOURCE
#include "simstate.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[4096];      /* the node's root: the state file's directory */
static char g_dev[4096];       /* TESSERA_SIM_DEV; empty: everything visible */
static int g_visible[SIM_MAX_GPUS]; /* visible GPUs in index order */
static int g_nvisible;

/* ---------------------------------------------------------------- the driver's numbering */

/* The driver numbers its capabilities in the order of one static table: the NVLink
 * fabric-management capability (0), MIG `config` (1) and `monitor` (2), then for each of 32
 * GPUs and each of its 15 possible GPU-instance IDs the GI's `access` followed by the
 * `access` of its 8 possible compute instances. */
#define CAP_FIRST_GPU 3
#define CAP_GPUS 32
#define CAP_GIS 15
#define CAP_CIS 8
#define CAP_PER_GI (1 + CAP_CIS)
#define CAP_PER_GPU (CAP_GIS * CAP_PER_GI)

int sim_cap_minor(int gpu, int gi_id, int ci_id)
{
    if (gpu < 0 || gpu >= CAP_GPUS || gi_id < 0 || gi_id >= CAP_GIS || ci_id < -1 || ci_id >= CAP_CIS)
        return -1;
    return CAP_FIRST_GPU + gpu * CAP_PER_GPU + gi_id * CAP_PER_GI + 1 + ci_id;
}

/* ---------------------------------------------------------------- creating the files */

static void mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

/* dirname of the state file, the node's root; 0 when there is none. */
static int node_root(const char *state_path, char *out, size_t cap)
{
    const char *slash = strrchr(state_path, '/');
    size_t n = slash ? (size_t)(slash - state_path) : 1;
    if (n == 0)
        n = 1; /* the state file is in / */
    if (n >= cap)
        return 0;
    memcpy(out, slash ? state_path : ".", n);
    out[n] = '\0';
    return 1;
}

/* Create an empty file (as the driver's device node), leaving one that exists alone. */
static void touch(const char *root, const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", root, dir);
    mkdirs(path);
    snprintf(path, sizeof path, "%s/%s/%s", root, dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) {
        fchmod(fd, 0666); /* whatever the umask: every container of the node opens it */
        close(fd);
    }
}

static void write_mig_minors(const char *root)
{
    char dir[4200], path[4300], tmp[4400];
    snprintf(dir, sizeof dir, "%s/proc/driver/nvidia-caps", root);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/mig-minors", dir);
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f)
        return;
    fprintf(f, "config 1\nmonitor 2\n");
    for (int g = 0; g < CAP_GPUS; g++)
        for (int gi = 0; gi < CAP_GIS; gi++) {
            fprintf(f, "gpu%d/gi%d/access %d\n", g, gi, sim_cap_minor(g, gi, -1));
            for (int ci = 0; ci < CAP_CIS; ci++)
                fprintf(f, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, sim_cap_minor(g, gi, ci));
        }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || chmod(tmp, 0644) != 0 || rename(tmp, path) != 0)
        unlink(tmp);
}

static void publish_node(const struct sim_state *st)
{
    for (uint32_t g = 0; g < st->ngpus; g++) {
        char name[32];
        snprintf(name, sizeof name, "nvidia%u", g);
        touch(g_root, "dev", name);
    }
    write_mig_minors(g_root);
}

void sim_dev_publish_cap(int gpu, uint32_t gi_id, int ci_id)
{
    char name[48];
    int minor = sim_cap_minor(gpu, (int)gi_id, ci_id);
    if (minor < 0 || !g_root[0])
        return;
    snprintf(name, sizeof name, "nvidia-cap%d", minor);
    touch(g_root, "dev/nvidia-caps", name);
}

/* ---------------------------------------------------------------- visibility */

static int have(const char *fmt, int n)
{
    char path[4200];
    snprintf(path, sizeof path, fmt, g_dev, n);
    return access(path, F_OK) == 0;
}

void sim_dev_load(const char *state_path, const struct sim_state *st, int fresh)
{
    if (!node_root(state_path, g_root, sizeof g_root))
        g_root[0] = '\0';
    else if (fresh)
        publish_node(st);
    const char *dev = getenv("TESSERA_SIM_DEV");
    sim_copy_str(g_dev, sizeof g_dev, dev ? dev : "");
    g_nvisible = 0;
    for (uint32_t g = 0; g < st->ngpus; g++)
        if (!g_dev[0] || have("%s/nvidia%d", (int)g))
            g_visible[g_nvisible++] = (int)g;
}

int sim_gpu_count(void) { return g_nvisible; }

int sim_gpu_at(int i) { return i >= 0 && i < g_nvisible ? g_visible[i] : -1; }

int sim_gpu_index(int gpu)
{
    for (int i = 0; i < g_nvisible; i++)
        if (g_visible[i] == gpu)
            return i;
    return -1;
}

int sim_mig_visible(int gpu, uint32_t gi_id, int ci_id)
{
    if (sim_gpu_index(gpu) < 0)
        return 0;
    if (!g_dev[0])
        return 1;
    return have("%s/nvidia-caps/nvidia-cap%d", sim_cap_minor(gpu, (int)gi_id, -1)) &&
           (ci_id < 0 || have("%s/nvidia-caps/nvidia-cap%d", sim_cap_minor(gpu, (int)gi_id, ci_id)));
}

int sim_mig_devices(int gpu, int *slots, int *cis, int cap)
{
    const struct sim_gpu *g = &sim_state()->gpu[gpu];
    int n = 0;
    for (uint32_t id = 0; id < CAP_GIS; id++)
        for (int k = 0; k < SIM_MAX_GIS; k++) {
            const struct sim_gi *gi = &g->gi[k];
            if (!gi->used || gi->id != id)
                continue;
            for (uint32_t cid = 0; cid < SIM_MAX_CIS; cid++)
                for (int c = 0; c < SIM_MAX_CIS; c++)
                    if (gi->ci[c].used && gi->ci[c].id == cid && n < cap &&
                        sim_mig_visible(gpu, gi->id, (int)cid)) {
                        slots[n] = k + 1;
                        cis[n] = c;
                        n++;
                    }
        }
    return n;
}
