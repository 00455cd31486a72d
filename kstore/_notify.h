/* The notification word of kstore/_notify.pyx: a 32-bit futex word in a shared mapping.
 * Bit 0 says "a waiter is armed"; bits 1..31 count changes. Atomics are GCC/Clang builtins;
 * futex(2) and futex_waitv(2) exist on Linux only (elsewhere the calls report ENOSYS and the
 * Python side waits in bounded sleeps). */
#ifndef KSTORE_NOTIFY_H
#define KSTORE_NOTIFY_H
#include <stdint.h>
#include <errno.h>
#include <limits.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sched.h>
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449            /* the same number on every architecture */
#endif
#ifndef FUTEX_32
#define FUTEX_32 2
#endif
#endif

static inline uint32_t kn_load(uint32_t *w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

static inline int64_t kn_load64(int64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

static inline void kn_store64(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

/* Arm: set the waiter bit unless set; returns the word as armed (bit 0 set). A waiter checks
 * its condition after arming and then sleeps on exactly this value: a bump in between changes
 * the word (the sleep returns at once) and sees the bit (it wakes). */
static inline uint32_t kn_arm(uint32_t *w) {
    uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    while (!(v & 1u)) {
        if (__atomic_compare_exchange_n(w, &v, v | 1u, 0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
            return v | 1u;
    }
    return v;
}

/* Bump: count one change and clear the waiter bit, in one atomic step (the stores before it
 * are released with it). Returns nonzero if a waiter was armed: the caller then wakes. */
static inline uint32_t kn_bump(uint32_t *w) {
    uint32_t v = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(w, &v, (v + 2u) & ~1u, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED)) {
    }
    return v & 1u;
}

static inline int kn_wake(uint32_t *w);

/* Pre-wake: a writer about to change the log clears the waiter bit (the counter unchanged)
 * and, if it was set, wakes the sleepers now, so that their wake-up (tens of µs: the IPI, the
 * idle CPU coming back, the scheduler) overlaps the writer's own work instead of following it.
 * A woken waiter that finds the word at its armed value less the bit spins (kn_settle) for the
 * bump that follows; the bump then finds no bit and makes no syscall. Returns nonzero if it
 * woke anyone. */
static inline uint32_t kn_prewake(uint32_t *w) {
    uint32_t v = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (v & 1u) {
        if (__atomic_compare_exchange_n(w, &v, v & ~1u, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
            kn_wake(w);
            return 1;
        }
    }
    return 0;
}

static inline int kn_wake(uint32_t *w) {
#ifdef __linux__
    if (syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0) < 0) return errno;
    return 0;
#else
    (void)w;
    return ENOSYS;
#endif
}

/* Sleep while *w == val, at most timeout_ns. 0: woken; EAGAIN: the word had changed already;
 * ETIMEDOUT; EINTR (a signal); ENOSYS: no futex here. */
static inline int kn_wait(uint32_t *w, uint32_t val, int64_t timeout_ns) {
#ifdef __linux__
    struct timespec ts;
    if (timeout_ns < 0) timeout_ns = 0;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000);
    ts.tv_nsec = (long)(timeout_ns % 1000000000);
    if (syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0) < 0) return errno;
    return 0;
#else
    (void)w; (void)val; (void)timeout_ns;
    return ENOSYS;
#endif
}

static inline int64_t kn_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Busy-wait (bounded) for *w != val; 1 if it changed. */
static inline int kn_spin(uint32_t *w, uint32_t val, int64_t ns) {
    int64_t end = kn_now_ns() + ns;
    for (;;) {
        for (int i = 0; i < 256; i++) {
            if (__atomic_load_n(w, __ATOMIC_ACQUIRE) != val) return 1;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        if (kn_now_ns() >= end) return 0;
    }
}

/* After a sleep on `armed` ended (woken, or the word had changed): if the word is `armed`
 * less the waiter bit (a writer's pre-wake: its change is under way), spin at most ns for the
 * bump. 1 if the word then differs from `armed` less the bit, else 0. */
static inline int kn_settle(uint32_t *w, uint32_t armed, int64_t ns) {
    uint32_t pre = armed & ~1u;
    int64_t end;
    if (ns <= 0 || __atomic_load_n(w, __ATOMIC_ACQUIRE) != pre) return 1;
    end = kn_now_ns() + ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (__atomic_load_n(w, __ATOMIC_ACQUIRE) != pre) return 1;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        if (kn_now_ns() >= end) return 0;
#ifdef __linux__
        sched_yield();      /* the writer may share this CPU: let it finish its append */
#endif
    }
}

/* futex_waitv(2): sleep until any of n words differs from its value (Linux 5.16+). */
struct kn_waitv { uint64_t val; uint64_t uaddr; uint32_t flags; uint32_t reserved; };

static inline int kn_wait_any(struct kn_waitv *v, unsigned n, int64_t timeout_ns) {
#ifdef __linux__
    struct timespec ts;
    int64_t end = kn_now_ns() + (timeout_ns < 0 ? 0 : timeout_ns);
    ts.tv_sec = (time_t)(end / 1000000000);
    ts.tv_nsec = (long)(end % 1000000000);
    for (unsigned i = 0; i < n; i++) { v[i].flags = FUTEX_32; v[i].reserved = 0; }
    if (syscall(SYS_futex_waitv, v, n, 0, &ts, CLOCK_MONOTONIC) < 0) return errno;
    return 0;
#else
    (void)v; (void)n; (void)timeout_ns;
    return ENOSYS;
#endif
}
#endif
