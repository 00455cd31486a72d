/* The SIGBUS guard of kstore/_mapping.pyx. A file mapped by kstore that another process
 * truncates makes any later touch of a page past the new end raise SIGBUS, which kills the
 * process (a reader's scan, a user's zero-copy view, the writer's copy). The guard: every
 * file Mapping registers its address range here; a SIGBUS (BUS_ADRERR) at an address inside
 * one maps a private zero page over the faulting page (MAP_FIXED) and marks the range
 * poisoned, and the access resumes on zeros. Mapping users check the flag and raise a kstore
 * error naming the file (zeros are never taken for data). A SIGBUS anywhere else goes to the
 * handler installed before ours, or to the default action (the process dies as it would have).
 *
 * The registry is read by the signal handler while a thread holding the GIL changes it:
 * slots live in chunks allocated once and never freed, a slot's `end` is stored before its
 * `start` (release), and `start` is cleared first on removal. Linux only (elsewhere a no-op). */
#ifndef KSTORE_SIGBUS_H
#define KSTORE_SIGBUS_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>
#include <sys/mman.h>

#define KS_CHUNK 1024
#define KS_MAX_CHUNKS 4096                /* 4M mappings at most; more are left unguarded */

typedef struct {
    uintptr_t start;                      /* 0: free */
    uintptr_t end;
    int poisoned;                         /* set by the handler, read by the Mapping */
} ks_range;

static ks_range *ks_chunks[KS_MAX_CHUNKS];
static int ks_nchunks = 0;
static long long *ks_free = NULL;           /* stack of free slot numbers (GIL held) */
static long long ks_nfree = 0, ks_free_cap = 0;
static struct sigaction ks_prev;
static int ks_installed = 0;
static volatile sig_atomic_t ks_leaving = 0;
static uintptr_t ks_page = 4096;

/* A SIGBUS that is not ours: passed to the handler installed before ours, called from here (we
 * stay installed, so a previous handler that is gone since, e.g. faulthandler disabled, whose
 * function now returns at once, is not left to take the faulting access again and again). A
 * signal that comes back to us while that handler runs (faulthandler restores its previous
 * handler, ours, and raises), or a fault at the same address and instruction that the handler
 * just returned to (nothing fixed it), gets the default action: the process dies as it would have
 * without us, never loops. */
static volatile sig_atomic_t ks_chaining = 0;
static uintptr_t ks_last_fault = 0, ks_last_pc = 0;

/* Where the interrupted thread resumes (0 where unknown): a previous handler that returned
 * without moving it (no recovery stub, e.g. the JVM's) makes the same access fault again. */
static uintptr_t ks_pc(void *uc) {
#if defined(__linux__) && defined(__x86_64__)
    return uc != NULL ? (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP] : 0;
#elif defined(__linux__) && defined(__aarch64__)
    return uc != NULL ? (uintptr_t)((ucontext_t *)uc)->uc_mcontext.pc : 0;
#else
    return 0;
#endif
}

static void ks_die(int sig, siginfo_t *si) {
    ks_leaving = 1;
    signal(sig, SIG_DFL);
    if (si == NULL || si->si_code <= 0)
        raise(sig);                       /* sent: send it again; a fault: it happens again */
}

static void ks_chain(int sig, siginfo_t *si, void *uc) {
    struct sigaction prev = ks_prev;
    int hardware = si != NULL && si->si_code > 0;
    uintptr_t a = hardware ? (uintptr_t)si->si_addr : 0;
    if (ks_chaining || (hardware && a != 0 && a == ks_last_fault && ks_pc(uc) == ks_last_pc)) {
        ks_die(sig, si);
        return;
    }
    if (prev.sa_flags & SA_SIGINFO) {
        ks_chaining = 1;
        prev.sa_sigaction(sig, si, uc);
    } else if (prev.sa_handler == SIG_DFL) {
        ks_die(sig, si);
        return;
    } else if (prev.sa_handler == SIG_IGN) {
        if (hardware)
            ks_die(sig, si);              /* a fault cannot be ignored (the kernel kills) */
        return;
    } else {
        ks_chaining = 1;
        prev.sa_handler(sig);
    }
    ks_chaining = 0;
    if (hardware) {                       /* returned: the access runs again, or the handler's */
        ks_last_fault = a;                /* stub runs (a resume point moved: no loop) */
        ks_last_pc = ks_pc(uc);
    }
}

static void ks_handler(int sig, siginfo_t *si, void *uc) {
#ifdef __linux__
    if (si != NULL && si->si_code == BUS_ADRERR) {
        uintptr_t a = (uintptr_t)si->si_addr;
        int n = __atomic_load_n(&ks_nchunks, __ATOMIC_ACQUIRE);
        for (int c = 0; c < n; c++) {
            ks_range *ch = __atomic_load_n(&ks_chunks[c], __ATOMIC_ACQUIRE);
            if (ch == NULL)
                continue;
            for (int i = 0; i < KS_CHUNK; i++) {
                uintptr_t s = __atomic_load_n(&ch[i].start, __ATOMIC_ACQUIRE);
                /* start read again after end: the slot was not freed and reused between */
                if (s != 0 && s <= a && a < __atomic_load_n(&ch[i].end, __ATOMIC_ACQUIRE)
                        && __atomic_load_n(&ch[i].start, __ATOMIC_ACQUIRE) == s) {
                    void *page = (void *)(a & ~(ks_page - 1));
                    /* marked before the zeros are there: another thread that reads them
                     * (without a fault of its own) and then checks the mark finds it set */
                    __atomic_store_n(&ch[i].poisoned, 1, __ATOMIC_SEQ_CST);
                    void *p = mmap(page, ks_page, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                    if (p == page)
                        return;               /* the access resumes, on zeros */
                    goto not_ours;            /* no zeros: the process dies (mark moot) */
                }
            }
        }
    }
not_ours:
#endif
    ks_chain(sig, si, uc);
}

/* Make sure our handler is the process's (GIL held; called as mappings are made): installs it,
 * or installs it again over a handler installed since (faulthandler.enable() after import),
 * chaining to that one; that check (a syscall) is made at every 64th call. Returns 0, or -1
 * with errno. */
static unsigned ks_calls = 0;
static int ks_install(void) {
    struct sigaction sa, cur;
    if (ks_leaving)
        return 0;                         /* a fatal SIGBUS is under way */
    if (ks_installed) {
        if ((ks_calls++ & 63) != 0)
            return 0;
        if (sigaction(SIGBUS, NULL, &cur) != 0)
            return -1;
        if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == ks_handler)
            return 0;
    }
    ks_page = (uintptr_t)sysconf(_SC_PAGESIZE);
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = ks_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &ks_prev) != 0)
        return -1;
    ks_installed = 1;
    return 0;
}

/* Register [start, start + len) (GIL held); returns the slot's flag, or NULL (unguarded). */
static int *ks_register(void *start, size_t len, long long *slot_out) {
    long long slot;
    ks_range *r;
    *slot_out = -1;
    if (start == NULL || len == 0)
        return NULL;
    if (ks_nfree == 0) {
        int c = ks_nchunks;
        if (c >= KS_MAX_CHUNKS)
            return NULL;
        ks_range *ch = (ks_range *)calloc(KS_CHUNK, sizeof(ks_range));
        if (ch == NULL)
            return NULL;
        if (ks_free_cap < KS_CHUNK) {
            long long *f = (long long *)realloc(ks_free, sizeof(long long) * KS_CHUNK);
            if (f == NULL) {
                free(ch);
                return NULL;
            }
            ks_free = f;
            ks_free_cap = KS_CHUNK;
        }
        __atomic_store_n(&ks_chunks[c], ch, __ATOMIC_RELEASE);
        __atomic_store_n(&ks_nchunks, c + 1, __ATOMIC_RELEASE);
        for (int i = KS_CHUNK - 1; i >= 0; i--)
            ks_free[ks_nfree++] = (long long)c * KS_CHUNK + i;
        /* a free stack deeper than one chunk grows as slots come back (ks_unregister) */
    }
    slot = ks_free[--ks_nfree];
    r = &ks_chunks[slot / KS_CHUNK][slot % KS_CHUNK];
    __atomic_store_n(&r->poisoned, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->end, (uintptr_t)start + len, __ATOMIC_RELAXED);
    __atomic_store_n(&r->start, (uintptr_t)start, __ATOMIC_RELEASE);
    *slot_out = slot;
    return &r->poisoned;
}

/* Free a slot (GIL held), before the range is unmapped; returns 0, -1 if out of memory (the
 * slot is then cleared but not reused). */
static int ks_unregister(long long slot) {
    ks_range *r;
    if (slot < 0)
        return 0;
    r = &ks_chunks[slot / KS_CHUNK][slot % KS_CHUNK];
    __atomic_store_n(&r->start, 0, __ATOMIC_RELEASE);
    if (ks_nfree == ks_free_cap) {
        long long cap = ks_free_cap * 2;
        long long *f = (long long *)realloc(ks_free, sizeof(long long) * cap);
        if (f == NULL)
            return -1;
        ks_free = f;
        ks_free_cap = cap;
    }
    ks_free[ks_nfree++] = slot;
    return 0;
}
#endif
