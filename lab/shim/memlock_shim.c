/*
 * Lab-only stand-in for CAP_SYS_RESOURCE, which this machine's kernel withholds: no process
 * here may raise RLIMIT_MEMLOCK above the 8 MiB default, so pam_limits cannot grant the
 * "unlimited" it is configured for. Preloaded in the emulated Sparks only (/etc/ld.so.preload),
 * it records an "unlimited" memlock as a sentinel just below the real ceiling (which is
 * inherited across fork and exec like any limit) and reports the sentinel as unlimited.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/types.h>

/* The kernel ABI, declared here so as not to clash with glibc's prototypes being replaced. */
typedef unsigned long rlim_t;
struct rlimit { rlim_t rlim_cur, rlim_max; };
#define RLIMIT_MEMLOCK 8
#define RLIM_INFINITY (~0UL)
#define SENTINEL ((rlim_t)(8 * 1024 * 1024 - 4096))

typedef int (*prlimit_fn)(pid_t, int, const struct rlimit *, struct rlimit *);

static int real_prlimit(pid_t pid, int resource, const struct rlimit *new_limit, struct rlimit *old_limit) {
    static prlimit_fn real;
    if (!real)
        real = (prlimit_fn)dlsym(RTLD_NEXT, "prlimit");
    return real(pid, resource, new_limit, old_limit);
}

static rlim_t to_real(rlim_t value) { return value == RLIM_INFINITY || value > SENTINEL ? SENTINEL : value; }
static rlim_t to_virtual(rlim_t value) { return value == SENTINEL ? RLIM_INFINITY : value; }

int prlimit(pid_t pid, int resource, const struct rlimit *new_limit, struct rlimit *old_limit) {
    struct rlimit mapped;
    if (resource == RLIMIT_MEMLOCK && new_limit && new_limit->rlim_max == RLIM_INFINITY) {
        mapped.rlim_cur = to_real(new_limit->rlim_cur);
        mapped.rlim_max = SENTINEL;
        new_limit = &mapped;
    }
    int result = real_prlimit(pid, resource, new_limit, old_limit);
    if (result == 0 && resource == RLIMIT_MEMLOCK && old_limit) {
        old_limit->rlim_cur = to_virtual(old_limit->rlim_cur);
        old_limit->rlim_max = to_virtual(old_limit->rlim_max);
    }
    return result;
}

int prlimit64(pid_t pid, int resource, const struct rlimit *new_limit, struct rlimit *old_limit) {
    return prlimit(pid, resource, new_limit, old_limit);
}
int getrlimit(int resource, struct rlimit *limit) { return prlimit(0, resource, 0, limit); }
int getrlimit64(int resource, struct rlimit *limit) { return prlimit(0, resource, 0, limit); }
int setrlimit(int resource, const struct rlimit *limit) { return prlimit(0, resource, limit, 0); }
int setrlimit64(int resource, const struct rlimit *limit) { return prlimit(0, resource, limit, 0); }
