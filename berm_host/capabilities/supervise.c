/* berm-supervise PROGRAM ARG0 ARGS...: run PROGRAM as a command and leave none of its descendants alive.
 *
 * berm.exec.run starts every command through this program (built beside berm_host/capabilities/exec.py by
 * setup.py). Killing a command's process group when it exits misses every descendant that left the group
 * (`setsid daemon &`, a double fork into a new session). The supervisor is a child subreaper (prctl
 * PR_SET_CHILD_SUBREAPER): such orphans become its children instead of init's. When the command exits, or when the
 * host sends SIGTERM or dies (SIGTERM is also the supervisor's parent-death signal), it kills the command's group,
 * then SIGKILLs every child it has (found in /proc) until none is left, reaping them, and only then exits, with the
 * command's own status (a death by a signal re-raised on itself). The host therefore learns that everything the command started is gone from one event: this program's
 * exit. It is a program of its own, not a fork of the host, so it shares no memory with the host while it waits.
 *
 * The command gets descriptors 0-2 and the environment as given, every signal at its default and none blocked,
 * and leads a process group of its own. If PROGRAM cannot be started, a line on stderr says why and the exit
 * status is 127. The supervisor runs with the command's environment, dynamic loader variables included. A command
 * can kill its supervisor (same user) and so escape it: exec is a capability to run code as the host's user, not
 * a jail. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* The parent of process `pid`, from its stat line; 0 if it is gone or unreadable. */
static pid_t parent_of(pid_t pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t got = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[got] = 0;
    char *p = strrchr(line, ')'); /* the command name may hold ')' and spaces; the state and ppid follow it */
    int ppid;
    return p && sscanf(p + 1, " %*c %d", &ppid) == 1 ? ppid : 0;
}

/* SIGKILL every child of `self`; how many there were, or -1 if /proc cannot be read. */
static int kill_children(pid_t self) {
    DIR *proc = opendir("/proc");
    if (!proc)
        return -1;
    int count = 0;
    for (struct dirent *d; (d = readdir(proc));) {
        char *end;
        long pid = strtol(d->d_name, &end, 10);
        if (pid > 0 && !*end && parent_of((pid_t)pid) == self) {
            kill((pid_t)pid, SIGKILL);
            count++;
        }
    }
    closedir(proc);
    return count;
}

/* Every signal's action back to its default: one ignored stays ignored across exec (Python ignores SIGPIPE; a
 * SIGCHLD ignored would reap the command unseen, and the supervisor would never learn that it ended). */
static void default_signals(void) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &dfl, NULL);
}

/* The command's side of the fork. */
static void __attribute__((noreturn)) start_command(char *const argv[]) {
    setpgid(0, 0); /* it leads a process group of its own, killed as a whole when it exits */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(argv[0], argv + 1);
    fprintf(stderr, "berm-supervise: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static void __attribute__((noreturn)) exit_like(int status) {
    if (WIFEXITED(status))
        _exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status); /* the statuses collected here are exits or deaths by a signal */
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
}

int main(int argc, char *argv[]) {
    if (argc < 3) {
        fprintf(stderr, "usage: berm-supervise PROGRAM ARG0 [ARG...]\n");
        return 2;
    }
    pid_t host = getppid();
    default_signals();
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL); /* SIGCHLD and SIGTERM are taken by sigwaitinfo below, the rest wait */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the host gone, the command and all it started go too (below) */
    if (getppid() != host)
        return 127; /* the host died before the line above */

    pid_t command = fork();
    if (command == 0)
        start_command(argv + 1);
    if (command < 0) {
        fprintf(stderr, "berm-supervise: cannot fork: %s\n", strerror(errno));
        return 127;
    }
    setpgid(command, command); /* as the command does: whichever runs first, the group exists from here */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3; fd++)
        dup2(null, fd); /* the pipes end when the command and its descendants are gone, not the supervisor */
    close(null);

    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, SIGCHLD);
    sigaddset(&wake, SIGTERM);
    /* Wait for the command to exit (or the host's SIGTERM), reaping the orphans that end meanwhile; the command
       itself is left unreaped, so that its group id cannot be reused before the group is killed. */
    for (int stop = 0; !stop;) {
        if (sigwaitinfo(&wake, NULL) == SIGTERM)
            break;
        siginfo_t info;
        for (;;) {
            info.si_pid = 0;
            if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 || info.si_pid == 0)
                break;
            if (info.si_pid == command) {
                stop = 1;
                break;
            }
            waitpid(info.si_pid, NULL, 0);
        }
    }
    kill(-command, SIGKILL);
    int status = SIGKILL; /* W_EXITCODE(0, SIGKILL), should the command never be reaped below */
    for (;;) {
        int st;
        pid_t w = waitpid(-1, &st, WNOHANG);
        if (w > 0) {
            if (w == command)
                status = st;
            continue;
        }
        if (w < 0 || kill_children(getpid()) <= 0)
            break; /* none left, or /proc does not show them: better to leave them than to wait for them */
        w = waitpid(-1, &st, 0);
        if (w < 0)
            break;
        if (w == command)
            status = st;
    }
    exit_like(status);
}
