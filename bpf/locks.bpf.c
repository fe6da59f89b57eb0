/* locks.bpf.c: futex waits of the target's threads, and who ended them.
 *
 * Tracepoints only (syscalls:*futex*, lock:contention_*). Every wait is
 * summed in kernel maps; only waits of at least LOCK_FLOOR_NS become events,
 * so a hot, uncontended path costs a map update and nothing in user space.
 * The set's off-CPU periods (why a thread was off the CPU, and who woke it)
 * come from the one off-CPU tracker, bpf/offcpu.bpf.c, which this set turns
 * on (offcpu_events); it reads lock_pending, which this object's futex hooks
 * write: the maps both objects share are bpf/lock_state.bpf.h.
 *
 * Which code waited: the user registers at the syscall (bpf_task_pt_regs,
 * the architecture's ABI, not a kernel struct read through headers) give the
 * exact instruction pointer; a frame-pointer walk (lock_stacks) gives the
 * rest where the binaries keep frame pointers. Distribution libc and
 * libpython do not, so for waits of at least LOCK_SCAN_FLOOR_NS the kernel
 * also scans LOCK_SCAN_WORDS words above the user stack pointer and keeps
 * those that point into the targets' executable mappings (lock_exec, seeded
 * by user space): candidate return addresses, which user space checks
 * (preceded by a call instruction) and names. Only code addresses leave
 * the kernel, never stack data.
 *
 * A CPython thread's waits and wakes also carry its Python stack (the walk
 * of bpf/python_stacks.bpf.h): the Python function that waited, or released.
 *
 * Which semaphore waits are signals: uprobes in each target's libc
 * (attached per process by collector/attach/probe_sets/semaphores.py) remember
 * which thread took a semaphore with a sem_trywait that returned 0, until
 * the next sem_post or sem_init on it (lock_sem_taker). A futex wait on
 * that semaphore by the thread that took it is FUTEX_WAIT_FLAG_SEM_OWN: only
 * another thread's post can end it, so it waits for a signal (CPython's
 * Condition, Event and Queue waits), not for a lock someone holds; by any
 * other thread it is FUTEX_WAIT_FLAG_SEM_HELD.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h). Settings, written
 * by collector/attach/probe_sets/locks.py before load: lock_floor_ns,
 * lock_scan_floor_ns. The programs on tracepoints a kernel
 * may lack (futex_waitv, futex_wait/futex_wake, lock:contention_*) are left
 * out of the load there by the same set.
 */
#include "common.bpf.h"
#include "lock_state.bpf.h"
#include "python_stacks.bpf.h"

const volatile u64 lock_floor_ns = 10000;
const volatile u64 lock_scan_floor_ns = 50000;

/* futex(2) ops; the PRIVATE (128) and CLOCK_REALTIME (256) bits masked off. */
#define LK_FUTEX_CMD_MASK 0x7f
#define LK_FUTEX_WAIT 0
#define LK_FUTEX_WAKE 1
#define LK_FUTEX_REQUEUE 3
#define LK_FUTEX_CMP_REQUEUE 4
#define LK_FUTEX_WAKE_OP 5
#define LK_FUTEX_LOCK_PI 6
#define LK_FUTEX_UNLOCK_PI 7
#define LK_FUTEX_WAIT_BITSET 9
#define LK_FUTEX_WAKE_BITSET 10
#define LK_FUTEX_WAIT_REQUEUE_PI 11
#define LK_FUTEX_CMP_REQUEUE_PI 12
#define LK_FUTEX_LOCK_PI2 13
#define LK_OP_FUTEX_WAITV 0x100  /* our own op codes for the other wait syscalls */
#define LK_OP_FUTEX2_WAIT 0x101

struct lk_addr_key {
    u32 tgid;
    u32 pad;
    u64 uaddr;
};

struct lk_addr_state {
    s64 waiters;        /* threads inside a wait on this address now */
    u64 oldest_start;   /* start of the wait that made waiters go 0 -> 1 */
};

struct lk_addr_total {
    u64 waits;
    u64 wait_ns;
    u64 max_ns;
};

struct lk_waker {
    u64 ts_ns;
    u64 ip;
    u32 tid;
    s32 stack_id;
    u32 nscan;
    s32 python_stack_id;  /* bpf/python_stacks.bpf.h */
    u64 scan[LOCK_SCAN_HITS];
};

struct lk_scan_buf {
    u64 words[LOCK_SCAN_WORDS];
    u64 n;
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, struct lk_addr_key);
    __type(value, struct lk_addr_state);
} lock_addr_state SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct lk_addr_key);
    __type(value, struct lk_addr_total);
} lock_addr_totals SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, struct lk_addr_key);
    __type(value, struct lk_waker);
} lock_last_waker SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, u32);
    __type(value, u64);
} lock_klock_start SEC(".maps");
struct {   /* sem -> tid that took it */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, struct lk_addr_key);
    __type(value, u32);
} lock_sem_taker SEC(".maps");
struct {   /* tid -> sem in sem_trywait */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, u32);
    __type(value, u64);
} lock_sem_trying SEC(".maps");
struct {   /* addr >> 16 of code */
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, LOCK_EXEC_GRANULES);
    __type(key, u64);
    __type(value, u8);
} lock_exec SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct lk_scan_buf);
} lock_scan_buf SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct futex_wait_event);
} lock_event_buf SEC(".maps");

static __always_inline int lk_is_wait(u32 cmd)
{
    return cmd == LK_FUTEX_WAIT || cmd == LK_FUTEX_WAIT_BITSET || cmd == LK_FUTEX_LOCK_PI ||
           cmd == LK_FUTEX_LOCK_PI2 || cmd == LK_FUTEX_WAIT_REQUEUE_PI;
}

static __always_inline int lk_is_wake(u32 cmd)
{
    return cmd == LK_FUTEX_WAKE || cmd == LK_FUTEX_WAKE_BITSET || cmd == LK_FUTEX_UNLOCK_PI ||
           cmd == LK_FUTEX_WAKE_OP || cmd == LK_FUTEX_REQUEUE || cmd == LK_FUTEX_CMP_REQUEUE ||
           cmd == LK_FUTEX_CMP_REQUEUE_PI;
}

static __always_inline struct pt_regs *lk_user_regs(void)
{
    struct task_struct *task = bpf_get_current_task_btf();
    return (struct pt_regs *)bpf_task_pt_regs(task);
}

/* Is addr inside one of the targets' executable mappings? One hash lookup
 * per word: lock_exec holds every 64 KiB granule an executable mapping
 * touches (a binary search over ranges made the verifier's state count
 * explode). A granule can also hold a little data next to the code; user
 * space drops any candidate that does not follow a call instruction. */
static __always_inline int lk_in_exec(u64 addr)
{
    u64 granule = addr >> LOCK_EXEC_GRANULE_SHIFT;
    return bpf_map_lookup_elem(&lock_exec, &granule) != 0;
}

/* Copies LOCK_SCAN_WORDS words above sp into a per-CPU buffer and keeps up
 * to LOCK_SCAN_HITS that point into executable mappings. */
static __always_inline u32 lk_scan_stack(u64 sp, u64 *hits)
{
    u32 zero = 0;
    struct lk_scan_buf *buf = bpf_map_lookup_elem(&lock_scan_buf, &zero);
    if (!buf)
        return 0;
    if (bpf_probe_read_user(buf->words, sizeof(buf->words), (void *)sp) != 0) {
        /* Near the top of a stack the full window can cross into an unmapped
         * page: retry with a quarter of it. */
        __builtin_memset(buf->words, 0, sizeof(buf->words));
        if (bpf_probe_read_user(buf->words, sizeof(buf->words) / 4, (void *)sp) != 0)
            return 0;
    }
    lock_count(LOCK_COUNTER_SCANS, 1);
    /* The hit count lives in map memory on purpose: the verifier then treats
     * it as one unknown value instead of exploring every (word, count) pair. */
    buf->n = 0;
    for (int i = 0; i < LOCK_SCAN_WORDS; i++) {
        u64 word = buf->words[i];
        if (word < 4096 || !lk_in_exec(word))
            continue;
        u64 n = buf->n;
        if (n >= LOCK_SCAN_HITS)
            break;
        hits[n & (LOCK_SCAN_HITS - 1)] = word;
        buf->n = n + 1;
    }
    return buf->n;
}

/* ---------------------------------------------------------------- semaphores */

/* sem_trywait never blocks, so its uretprobe's trampoline is never on the
 * stack of a futex wait (the scan and the frame-pointer walk see the real
 * return addresses). A blocking take (sem_wait that had to wait) is not
 * recorded: its return probe would sit on the waiting stack.
 *
 * The probes sit on each function's first jump where it has one
 * (collector/binaries/uprobe_points.py), which its compare-and-swap loop may pass
 * again: every program here gives the same result when it runs twice, and
 * the return program acts once (it deletes what it read). */
SEC("uprobe")
int lock_sem_trywait_enter(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 sem = PT_REGS_PARM1(ctx);
    if (bpf_map_update_elem(&lock_sem_trying, &tid, &sem, BPF_ANY) != 0)
        lock_count(LOCK_COUNTER_MAP_FULL, 1);
    return 0;
}

SEC("uprobe")
int lock_sem_trywait_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    u64 *sem = bpf_map_lookup_elem(&lock_sem_trying, &tid);
    if (!sem)
        return 0;
    struct lk_addr_key key = {.tgid = id >> 32, .uaddr = *sem};
    bpf_map_delete_elem(&lock_sem_trying, &tid);
    if ((int)PT_REGS_RC(ctx) != 0)
        return 0;
    bpf_map_update_elem(&lock_sem_taker, &key, &tid, BPF_ANY);
    lock_count(LOCK_COUNTER_SEM_TAKES, 1);
    return 0;
}

/* sem_post, sem_init: whoever took it no longer holds it (or it is a new
 * semaphore at a reused address). */
SEC("uprobe")
int lock_sem_release(struct pt_regs *ctx)
{
    struct lk_addr_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .uaddr = PT_REGS_PARM1(ctx)};
    bpf_map_delete_elem(&lock_sem_taker, &key);
    return 0;
}

/* glibc's sem_t keeps its value in the word at offset 0 on 64-bit targets, so
 * a semaphore wait's futex address is the semaphore's own. */
static __always_inline u32 lk_sem_flags(u64 id, u64 uaddr)
{
    struct lk_addr_key key = {.tgid = id >> 32, .uaddr = uaddr};
    u32 *taker = bpf_map_lookup_elem(&lock_sem_taker, &key);
    if (!taker)
        return 0;
    return *taker == (u32)id ? FUTEX_WAIT_FLAG_SEM_OWN : FUTEX_WAIT_FLAG_SEM_HELD;
}

/* ---------------------------------------------------------------- waits */

static __always_inline void lk_begin_wait(u64 id, u64 uaddr, u32 op, u32 val, u32 flags)
{
    u32 tid = (u32)id;
    struct lk_pending p = {};
    p.start_ns = bpf_ktime_get_ns();
    p.uaddr = uaddr;
    p.op = op;
    p.val = val;
    p.flags = flags | lk_sem_flags(id, uaddr);
    if (bpf_map_update_elem(&lock_pending, &tid, &p, BPF_ANY) != 0) {
        lock_count(LOCK_COUNTER_MAP_FULL, 1);
        return;
    }
    struct lk_addr_key key = {.tgid = id >> 32, .uaddr = uaddr};
    struct lk_addr_state fresh = {.waiters = 0, .oldest_start = p.start_ns};
    struct lk_addr_state *st = lookup_or_try_init(&lock_addr_state, &key, &fresh);
    if (!st) {
        lock_count(LOCK_COUNTER_MAP_FULL, 1);
        return;
    }
    if (__sync_fetch_and_add(&st->waiters, 1) <= 0)
        st->oldest_start = p.start_ns;
}

/* A FUTEX_WAKE-like call: remember who released the address if anyone waits. */
static __always_inline void lk_note_wake(void *ctx, u64 id, u64 uaddr)
{
    struct lk_addr_key key = {.tgid = id >> 32, .uaddr = uaddr};
    struct lk_addr_state *st = bpf_map_lookup_elem(&lock_addr_state, &key);
    if (!st || st->waiters <= 0)
        return;
    u64 now = bpf_ktime_get_ns();
    /* A waiter woken before the floor is never streamed, so nobody would
     * read its waker: skip the stack walk (the ping-pong case). */
    if (now - st->oldest_start < lock_floor_ns)
        return;
    struct lk_waker w = {};
    w.ts_ns = now;
    w.tid = (u32)id;
    struct pt_regs *regs = lk_user_regs();
    w.ip = PT_REGS_IP(regs);
    w.stack_id = bpf_get_stackid(ctx, &lock_stacks, BPF_F_USER_STACK);
    if (w.stack_id < 0)
        lock_count(LOCK_COUNTER_STACK_MISSING, 1);
    w.python_stack_id = python_stack_id(id >> 32, (u32)id);
    /* The scan costs a few microseconds: only when a waiter has already
     * waited long enough for its own wait to be scanned. */
    if (now - st->oldest_start >= lock_scan_floor_ns)
        w.nscan = lk_scan_stack(PT_REGS_SP(regs), w.scan);
    bpf_map_update_elem(&lock_last_waker, &key, &w, BPF_ANY);
}

static __always_inline void lk_end_wait(void *ctx, long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct lk_pending *p = bpf_map_lookup_elem(&lock_pending, &tid);
    if (!p)
        return;
    u64 now = bpf_ktime_get_ns();
    u64 duration = now - p->start_ns;
    u64 start = p->start_ns;
    u64 uaddr = p->uaddr;
    u32 op = p->op, val = p->val, flags = p->flags;
    bpf_map_delete_elem(&lock_pending, &tid);

    struct lk_addr_key key = {.tgid = id >> 32, .uaddr = uaddr};
    struct lk_addr_state *st = bpf_map_lookup_elem(&lock_addr_state, &key);
    if (st)
        __sync_fetch_and_add(&st->waiters, -1);
    struct lk_addr_total zero_total = {};
    struct lk_addr_total *total = lookup_or_try_init(&lock_addr_totals, &key, &zero_total);
    if (total) {
        __sync_fetch_and_add(&total->waits, 1);
        __sync_fetch_and_add(&total->wait_ns, duration);
        if (duration > total->max_ns)
            total->max_ns = duration;
    } else {
        lock_count(LOCK_COUNTER_MAP_FULL, 1);
    }
    lock_count(LOCK_COUNTER_WAITS, 1);
    lock_count(LOCK_COUNTER_WAIT_NS, duration);
    if (duration < lock_floor_ns) {
        lock_count(LOCK_COUNTER_SHORT_WAITS, 1);
        lock_count(LOCK_COUNTER_SHORT_WAIT_NS, duration);
        return;
    }

    u32 zero = 0;
    struct futex_wait_event *ev = bpf_map_lookup_elem(&lock_event_buf, &zero);
    if (!ev)
        return;
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, EVENT_FUTEX_WAIT, start, id);
    ev->uaddr = uaddr;
    ev->duration_ns = duration;
    ev->op = op;
    ev->val = val;
    ev->ret = ret;
    ev->flags = flags;
    struct pt_regs *regs = lk_user_regs();
    ev->ip = PT_REGS_IP(regs);
    ev->stack_id = bpf_get_stackid(ctx, &lock_stacks, BPF_F_USER_STACK);
    if (ev->stack_id < 0)
        lock_count(LOCK_COUNTER_STACK_MISSING, 1);
    ev->python_stack_id = python_stack_id(id >> 32, tid);
    if (duration >= lock_scan_floor_ns) {
        ev->flags |= FUTEX_WAIT_FLAG_SCANNED;
        ev->nscan = lk_scan_stack(PT_REGS_SP(regs), ev->scan);
    }
    ev->waker_stack_id = -1;
    struct lk_waker *w = bpf_map_lookup_elem(&lock_last_waker, &key);
    if (w && w->ts_ns >= start && w->ts_ns <= now) {
        ev->waker_tid = w->tid;
        ev->waker_ip = w->ip;
        ev->waker_stack_id = w->stack_id;
        ev->waker_python_stack_id = w->python_stack_id;
        ev->waker_nscan = w->nscan;
        __builtin_memcpy(ev->waker_scan, w->scan, sizeof(ev->waker_scan));
    }
    send_event(ev, sizeof(*ev));
}

/* The syscalls' tracepoints: futex(uaddr, op, val, ...) in args[]. */
SEC("tracepoint/syscalls/sys_enter_futex")
int lock_enter_futex(struct trace_event_raw_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u32 cmd = (u32)args->args[1] & LK_FUTEX_CMD_MASK;
    if (lk_is_wait(cmd))
        lk_begin_wait(id, (u64)args->args[0], cmd, (u32)args->args[2], 0);
    else if (lk_is_wake(cmd))
        lk_note_wake(args, id, (u64)args->args[0]);
    return 0;
}

SEC("tracepoint/syscalls/sys_exit_futex")
int lock_exit_futex(struct trace_event_raw_sys_exit *args)
{
    lk_end_wait(args, args->ret);
    return 0;
}

/* futex_waitv(waiters, nr_futexes, flags, timeout, clockid): Linux 5.16+. */
SEC("tracepoint/syscalls/sys_enter_futex_waitv")
int lock_enter_futex_waitv(struct trace_event_raw_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    /* struct futex_waitv { u64 val; u64 uaddr; u32 flags; u32 reserved; }:
     * the first waiter's futex names the wait. */
    u64 uaddr = 0;
    bpf_probe_read_user(&uaddr, sizeof(uaddr), (char *)args->args[0] + 8);
    lk_begin_wait(id, uaddr, LK_OP_FUTEX_WAITV, 0, FUTEX_WAIT_FLAG_WAITV);
    return 0;
}

SEC("tracepoint/syscalls/sys_exit_futex_waitv")
int lock_exit_futex_waitv(struct trace_event_raw_sys_exit *args)
{
    lk_end_wait(args, args->ret);
    return 0;
}

/* futex_wait(uaddr, val, mask, flags, timeout, clockid) and
 * futex_wake(uaddr, mask, nr, flags): Linux 6.7+. */
SEC("tracepoint/syscalls/sys_enter_futex_wait")
int lock_enter_futex_wait(struct trace_event_raw_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    lk_begin_wait(id, (u64)args->args[0], LK_OP_FUTEX2_WAIT, (u32)args->args[1], FUTEX_WAIT_FLAG_FUTEX2);
    return 0;
}

SEC("tracepoint/syscalls/sys_exit_futex_wait")
int lock_exit_futex_wait(struct trace_event_raw_sys_exit *args)
{
    lk_end_wait(args, args->ret);
    return 0;
}

SEC("tracepoint/syscalls/sys_enter_futex_wake")
int lock_enter_futex_wake(struct trace_event_raw_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    lk_note_wake(args, id, (u64)args->args[0]);
    return 0;
}

/* ---------------------------------------------------------------- kernel locks */

/* lock:contention_begin/end: Linux 5.19+. */
SEC("tracepoint/lock/contention_begin")
int lock_contention_begin(void *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u32 tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    bpf_map_update_elem(&lock_klock_start, &tid, &now, BPF_ANY);
    return 0;
}

SEC("tracepoint/lock/contention_end")
int lock_contention_end(void *args)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 *start = bpf_map_lookup_elem(&lock_klock_start, &tid);
    if (!start)
        return 0;
    u64 duration = bpf_ktime_get_ns() - *start;
    bpf_map_delete_elem(&lock_klock_start, &tid);
    lock_count(LOCK_COUNTER_KLOCK_WAITS, 1);
    lock_count(LOCK_COUNTER_KLOCK_NS, duration);
    return 0;
}
