/*
 * A rank for the launcher's tests (tests/tests/launcher.rs), one mode per argument:
 *
 *   env            prints the launcher variables it got and its open-file limit, then joins the
 *                  world and reduces once
 *   first [segv]   20 allreduces, then rank 2 leaves: exit(3) (or a segmentation fault); the others
 *                  exit 10 as soon as their allreduce fails
 *   shrink         the last rank SIGKILLs itself mid-run; the survivors shrink, reduce once more
 *                  and exit 0 (a failure the job outlives)
 *   straggler      every rank reduces 5 times; the others exit 0, the last rank SIGKILLs itself
 *                  200 ms later (a failure on the way out, after the job's work)
 *   rebuild        rank 1 SIGKILLs itself; the survivors rebuild, admitting the replacement
 *                  hccnrun starts; everyone prints its rank in the new world and exits 0
 *   churn N        N cycles of: the last rank SIGKILLs itself after an allreduce, the others
 *                  rebuild, admitting its replacement; rank 0 prints "EPOCH e" at each epoch
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "hccn.h"

static const char *var(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

static hccn_comm *join(void)
{
    hccn_comm *c;
    if (hccn_init_from_env(&c) != HCCN_SUCCESS) {
        fprintf(stderr, "init: %s\n", hccn_get_last_error());
        exit(2);
    }
    return c;
}

static int reduce(hccn_comm *c, uint32_t want)
{
    float one = 1, sum = 0;
    if (hccn_allreduce(&one, &sum, 1, HCCN_FP32, HCCN_SUM, c, NULL) != HCCN_SUCCESS)
        return -1;
    return sum == (float)want ? 0 : -2;
}

static uint32_t rank_of(hccn_comm *c)
{
    uint32_t r = 0;
    hccn_comm_rank(c, &r);
    return r;
}

static uint32_t size_of(hccn_comm *c)
{
    uint32_t n = 0;
    hccn_comm_size(c, &n);
    return n;
}

static int env(void)
{
    static const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "HCCN_RANK", "EXTRA"};
    printf("ENV");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        printf(" %s=%s", names[i], var(names[i]));
    struct rlimit files;
    getrlimit(RLIMIT_NOFILE, &files);
    printf(" NOFILE=%llu\n", (unsigned long long)files.rlim_cur);
    hccn_comm *c = join();
    int ok = reduce(c, size_of(c));
    printf("WORLD rank=%u size=%u reduce=%s\n", rank_of(c), size_of(c), ok == 0 ? "ok" : "failed");
    hccn_comm_destroy(c);
    return ok == 0 ? 0 : 1;
}

static int first(int segv)
{
    hccn_comm *c = join();
    uint32_t me = rank_of(c), n = size_of(c);
    for (int i = 0;; i++) {
        if (me == 2 && i == 20) {
            if (segv)
                raise(SIGSEGV);
            exit(3);
        }
        if (reduce(c, n) != 0) {
            fprintf(stderr, "rank %u: %s\n", me, hccn_get_last_error());
            return 10;
        }
    }
}

static int shrink(void)
{
    hccn_comm *c = join();
    uint32_t me = rank_of(c), n = size_of(c);
    for (int i = 0;; i++) {
        if (me == n - 1 && i == 20)
            raise(SIGKILL);
        if (reduce(c, n) != 0)
            break;
    }
    hccn_comm *small;
    if (hccn_comm_shrink(c, &small) != HCCN_SUCCESS || reduce(small, n - 1) != 0) {
        fprintf(stderr, "rank %u: %s\n", me, hccn_get_last_error());
        return 1;
    }
    printf("FINISHED rank=%u size=%u\n", rank_of(small), size_of(small));
    hccn_comm_destroy(small);
    hccn_comm_destroy(c);
    return 0;
}

static int straggler(void)
{
    hccn_comm *c = join();
    uint32_t me = rank_of(c), n = size_of(c);
    for (int i = 0; i < 5; i++)
        if (reduce(c, n) != 0)
            return 1;
    printf("DONE rank=%u\n", me);
    if (me == n - 1) {
        usleep(200 * 1000);
        raise(SIGKILL);
    }
    hccn_comm_destroy(c);
    return 0;
}

static int rebuild(void)
{
    hccn_comm *c = join();
    uint64_t epoch = 0;
    hccn_comm_epoch(c, &epoch);
    if (epoch == 0) {
        uint32_t me = rank_of(c), n = size_of(c);
        for (int i = 0;; i++) {
            if (me == 1 && i == 20)
                raise(SIGKILL);
            if (reduce(c, n) != 0)
                break;
        }
        hccn_comm *grown;
        if (hccn_comm_rebuild(c, 60000, &grown) != HCCN_SUCCESS) {
            fprintf(stderr, "rank %u: rebuild: %s\n", me, hccn_get_last_error());
            return 1;
        }
        hccn_comm_destroy(c);
        c = grown;
        hccn_comm_epoch(c, &epoch);
    }
    int ok = reduce(c, size_of(c));
    printf("AFTER rank=%u size=%u epoch=%llu reduce=%s\n", rank_of(c), size_of(c), (unsigned long long)epoch,
           ok == 0 ? "ok" : "failed");
    fflush(stdout);
    /* Alive a little longer, so that a line printed just before the end is not the last word. */
    usleep(300 * 1000);
    hccn_comm_destroy(c);
    return ok == 0 ? 0 : 1;
}

/* Entries of a /proc/self directory: descriptors held (fd), threads (task). */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 2; /* less "." and ".."; fd counts the directory's own descriptor too */
}

static int churn(uint64_t cycles)
{
    hccn_comm *c = join();
    for (;;) {
        uint32_t me = rank_of(c), n = size_of(c);
        uint64_t epoch = 0;
        hccn_comm_epoch(c, &epoch);
        if (reduce(c, n) == 0) {
            if (me == 0)
                printf("EPOCH %llu FDS %d THREADS %d\n", (unsigned long long)epoch, entries("/proc/self/fd"),
                       entries("/proc/self/task"));
            if (epoch >= cycles) {
                hccn_comm_destroy(c);
                return 0;
            }
            if (me == n - 1)
                raise(SIGKILL);
            continue;
        }
        hccn_comm *next;
        if (hccn_comm_rebuild(c, 60000, &next) != HCCN_SUCCESS) {
            fprintf(stderr, "rank %u: rebuild: %s\n", me, hccn_get_last_error());
            return 1;
        }
        hccn_comm_destroy(c);
        c = next;
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "env"))
        return env();
    if (!strcmp(mode, "first"))
        return first(argc > 2 && !strcmp(argv[2], "segv"));
    if (!strcmp(mode, "shrink"))
        return shrink();
    if (!strcmp(mode, "rebuild"))
        return rebuild();
    if (!strcmp(mode, "straggler"))
        return straggler();
    if (!strcmp(mode, "churn") && argc > 2)
        return churn(strtoull(argv[2], NULL, 10));
    fprintf(stderr, "usage: launcher_rank env|first [segv]|shrink|straggler|rebuild|churn N\n");
    return 2;
}
