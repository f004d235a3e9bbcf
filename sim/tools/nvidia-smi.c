/* The Python reference nvidia-smi of the tessera simulated GPU node (build/bin/nvidia-smi-py,
 * what tests/test_smi_c.py compares the installed C tool, tools/smi/, with): a launcher for
 * the formatter over NVML calls (python -m tessera_sim.smi) into the simulator's
 * libnvidia-ml.so.1.
 *
 * Relocatable: it finds the simulator's files beside itself (<dir>/bin/nvidia-smi-py,
 * <dir>/lib/libnvidia-ml.so.1, <dir>/py/tessera_sim), so a copy of the build directory works
 * wherever it is mounted.  The Python is the one the simulator was built with (SIM_PYTHON),
 * else the first of PYTHONS that exists. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SIM_PYTHON
#define SIM_PYTHON "/usr/bin/python3"
#endif

static const char *const PYTHONS[] = {SIM_PYTHON, "/usr/bin/python3", "/usr/bin/python3.11",
                                      "/usr/local/bin/python3", NULL};

/* VAR=<prefix>[:old value] */
static int prepend(const char *var, const char *prefix) {
    const char *old = getenv(var);
    char buf[3 * PATH_MAX];
    int n = old && *old ? snprintf(buf, sizeof buf, "%s:%s", prefix, old)
                        : snprintf(buf, sizeof buf, "%s", prefix);
    if (n < 0 || (size_t)n >= sizeof buf) return -1;
    return setenv(var, buf, 1);
}

int main(int argc, char **argv) {
    char self[PATH_MAX], lib[PATH_MAX + 8], py[PATH_MAX + 8];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "nvidia-smi (simulated): cannot read /proc/self/exe: %s\n",
                strerror(errno));
        return 255;
    }
    self[len] = '\0';
    for (int up = 0; up < 2; up++) { /* <dir>/bin/nvidia-smi-py -> <dir> */
        char *slash = strrchr(self, '/');
        if (slash == NULL) return 255;
        *slash = '\0';
    }
    snprintf(lib, sizeof lib, "%s/lib", self);
    snprintf(py, sizeof py, "%s/py", self);
    if (prepend("LD_LIBRARY_PATH", lib) != 0 || prepend("PYTHONPATH", py) != 0) {
        fprintf(stderr, "nvidia-smi (simulated): environment too long\n");
        return 255;
    }
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (args == NULL) return 255;
    args[1] = "-m";
    args[2] = "tessera_sim.smi";
    for (int i = 1; i < argc; i++) args[i + 2] = argv[i];
    for (const char *const *p = PYTHONS; *p; p++) {
        if (access(*p, X_OK) != 0) continue;
        args[0] = (char *)*p;
        execv(*p, args);
    }
    fprintf(stderr, "nvidia-smi (simulated): no Python found (%s, /usr/bin/python3, ...)\n",
            SIM_PYTHON);
    return 255;
}
