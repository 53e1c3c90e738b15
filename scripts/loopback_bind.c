/* mpirun on loopback: an LD_PRELOAD library that horovodrun (as
 * patches/horovod-0.28.1/0010-open-mpi-on-one-host-listens-on-loopback.patch leaves it) puts in
 * mpirun's environment when every host of an Open MPI job is this machine. The install builds it
 * into the installed horovod/runner/ (scripts/build_loopback_bind.sh).
 *
 * Open MPI 4.1's mpirun binds its out-of-band listener to INADDR_ANY and in6addr_any whatever
 * its MCA parameters say (create_listen and create_listen6 in orte/mca/oob/tcp/
 * oob_tcp_listener.c); on one host nothing but mpirun's own ranks, which reach it through PMIx,
 * ever connects to it. In mpirun (mpirun, mpiexec, orterun) this library makes a bind to "any"
 * a bind to loopback: 127.0.0.1 for INADDR_ANY, ::1 for in6addr_any; every other bind is
 * unchanged. Every other program it is loaded into (the shell that starts mpirun) is left
 * alone. mpirun then takes it out of LD_PRELOAD (any other entry stays), so the ranks it
 * starts never load it: their sockets are theirs.
 *
 *   cc -shared -fPIC -O2 -o loopback_bind.so loopback_bind.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int active;

static int is_mpirun(const char *name) {
    return !strcmp(name, "mpirun") || !strcmp(name, "mpiexec") || !strcmp(name, "orterun");
}

/* LD_PRELOAD less every entry naming this library (entries are separated by ':' or ' '). */
static void leave_preload(void) {
    const char *preload = getenv("LD_PRELOAD");
    Dl_info self;
    if (!preload || !dladdr((void *)leave_preload, &self) || !self.dli_fname) return;
    char *kept = calloc(strlen(preload) + 1, 1), *copy = strdup(preload), *save = NULL;
    if (!kept || !copy) { free(kept); free(copy); return; }
    for (char *entry = strtok_r(copy, ": ", &save); entry; entry = strtok_r(NULL, ": ", &save)) {
        if (!strcmp(entry, self.dli_fname)) continue;
        if (*kept) strcat(kept, ":");
        strcat(kept, entry);
    }
    if (*kept) setenv("LD_PRELOAD", kept, 1); else unsetenv("LD_PRELOAD");
    free(kept);
    free(copy);
}

__attribute__((constructor)) static void start(void) {
    active = is_mpirun(program_invocation_short_name);
    if (active) leave_preload();
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    if (!real_bind) { errno = ENOSYS; return -1; }
    if (active && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in in = *(const struct sockaddr_in *)addr;
        if (in.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&in, sizeof in);
        }
    } else if (active && addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6 = *(const struct sockaddr_in6 *)addr;
        if (!memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6addr_any)) {
            in6.sin6_addr = in6addr_loopback;
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
