/* offcpu_periods.bpf.h: a target thread's time off the CPU, one convention.
 *
 * The off-CPU tracker (offcpu.bpf.c) keeps one record per period for both of
 * its users, the off-CPU profile (where threads wait, weighted by how long) and
 * the lock set's events (why, and who woke them). What a period is, why it
 * began and which periods are kept is written here.
 *
 * A period runs from the switch-out to the switch-in. Its reason comes from
 * the state the thread was switched out in (sched_switch's own prev_state,
 * CO-RE relocated): no sleep bit in the low byte means it was still runnable
 * and preempted (0x100 is the "preempted" mark of newer kernels), D state is
 * uninterruptible (disk, page faults), anything else an interruptible sleep
 * (a futex wait is told from the others by the lock set's lock_pending). It is
 * split at the wake-up, where one is seen (sched_waking, for the events): before
 * it the thread was blocked, after it runnable but waiting for a CPU. A
 * preempted thread was runnable all along; without a wake-up seen, a sleeping
 * one was blocked all along. A period is kept when either part reaches the
 * set's floor: a short block followed by a long runqueue wait is the latter.
 */
#ifndef INFERPROBE_OFFCPU_PERIODS_BPF_H
#define INFERPROBE_OFFCPU_PERIODS_BPF_H

#define OFFCPU_TASK_STATE_MASK 0xff
#define OFFCPU_TASK_UNINTERRUPTIBLE 0x2

/* Why a thread switched out in prev_state went off the CPU. OFFCPU_FUTEX is
 * the lock set's refinement of OFFCPU_SLEEP, not known here. */
static __always_inline u32 offcpu_reason_of(long prev_state)
{
    long state = prev_state & OFFCPU_TASK_STATE_MASK;
    if (state == 0)
        return OFFCPU_PREEMPTED;
    return state & OFFCPU_TASK_UNINTERRUPTIBLE ? OFFCPU_IO : OFFCPU_SLEEP;
}

/* The wake-up known at the switch-out: a preempted thread is runnable from
 * then on; a sleeping one's is not known yet (0). */
static __always_inline u64 offcpu_wake_at_switch_out(u32 reason, u64 off_ns)
{
    return reason == OFFCPU_PREEMPTED ? off_ns : 0;
}

/* A period's two parts, at the switch-in now; wake_ns 0 when none was seen. */
static __always_inline void offcpu_period_split(u64 off_ns, u64 wake_ns, u64 now, u64 *blocked_ns,
                                                u64 *runq_ns)
{
    u64 wake = wake_ns ? wake_ns : now;
    *blocked_ns = wake - off_ns;
    *runq_ns = now - wake;
}

static __always_inline bool offcpu_period_kept(u64 blocked_ns, u64 runq_ns, u64 floor_ns)
{
    return blocked_ns >= floor_ns || runq_ns >= floor_ns;
}

#endif
