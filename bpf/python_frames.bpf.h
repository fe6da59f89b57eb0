/* python_frames.bpf.h: the CPython frame walk, from a thread state to its
 * innermost PYTHON_MAX_FRAMES frames.
 *
 * No map calls here: the caller (bpf/python_stacks.bpf.h) looks up the
 * thread's PyThreadState and its process's layout, and passes pointers. What is read, all with
 * bpf_probe_read_user from the target's memory:
 *
 *   tstate -> current frame      3.10: tstate->frame (a PyFrameObject)
 *                                3.11, 3.12: tstate->cframe->current_frame
 *                                3.13: tstate->current_frame
 *   frame  -> code object, instruction, link to the caller's frame, and the
 *             byte that marks where one C call of the eval loop began:
 *             3.11 is_entry (set on the outermost frame of the call), 3.12+
 *             owner (FRAME_OWNED_BY_CSTACK: a shim frame pushed under the
 *             call's first frame; skipped). 3.10 has one C call per frame.
 *
 * Offsets arrive per process in struct python_layout, filled by
 * collector/binaries/python_layouts.py (3.13's own _Py_DebugOffsets, or a table for
 * 3.10-3.12 checked against the live process). Each frame's first
 * layout->frame_read bytes are read in one helper call and the fields taken
 * from that copy: one read per frame rather than four.
 *
 * Each frame sent is its code object address and instruction field as read
 * (user space turns them into function, file and line: collector/
 * python_code.py). A 64-bit FNV-1a hash of the frames, taken as
 * they are read, lets the caller keep one copy of each distinct stack.
 */
#ifndef INFERPROBE_PYTHON_FRAMES_BPF_H
#define INFERPROBE_PYTHON_FRAMES_BPF_H

#ifndef PYTHON_MAX_FRAMES
#define PYTHON_MAX_FRAMES 32
#endif

#define PYTHON_FRAME_BUF 128  /* frame header bytes read at once (3.10's PyFrameObject needs 100) */

#ifndef PYTHON_MAX_THREADS_SCANNED
#define PYTHON_MAX_THREADS_SCANNED 128
#endif

/* python_layout.flags */
#define PYTHON_LAYOUT_CFRAME       0x1 /* current frame via tstate->cframe (3.11, 3.12) */
#define PYTHON_LAYOUT_PTHREAD_TID  0x2 /* the tid is in glibc's struct pthread behind tstate_tid (3.10) */

struct python_layout {
    u32 flags;              /* PYTHON_LAYOUT_* */
    u32 tstate_frame;       /* tstate -> current frame (or -> cframe with PYTHON_LAYOUT_CFRAME) */
    u32 cframe_frame;       /* cframe -> current frame */
    u32 frame_previous;
    u32 frame_code;
    u32 frame_instr;        /* 3.11+: pointer to a code unit; 3.10: int f_lasti (low half) */
    u32 frame_entry;        /* 3.11 is_entry, 3.12+ owner; 3.10: any byte (ignored) */
    u32 frame_read;         /* bytes of a frame to read: covers every field above */
    u32 interp_threads_head;  /* interpreter -> its first thread state */
    u32 tstate_next;
    u32 tstate_tid;         /* native_thread_id, or (PYTHON_LAYOUT_PTHREAD_TID) the pthread_t */
    u32 pthread_tid;        /* struct pthread -> kernel tid (PYTHON_LAYOUT_PTHREAD_TID) */
    u64 interp;             /* the main interpreter's PyInterpreterState address */
    u64 pidns_dev;          /* the process's pid namespace, where it is not ours (a container): */
    u64 pidns_ino;          /* thread states hold tids of that namespace (0: the same as BPF's) */
};

/* One frame as read, decoded by user space with the same layout: the branch-
 * free body keeps the verifier's work linear in the number of frames. */
struct python_frame {
    u64 code;               /* PyCodeObject address; bits 56-63: the frame's entry/owner byte */
    u64 instr;              /* the instruction field, raw */
};

struct python_stack {
    u32 depth;              /* frames used, innermost first */
    u32 check;              /* the hash's high half: tells two stacks of one id apart */
    u64 hash;
    struct python_frame frames[PYTHON_MAX_FRAMES];
};

struct python_frame_buf {
    u8 bytes[PYTHON_FRAME_BUF + 8];  /* the frame being read (+8: a u64 read at the last offset) */
};

static __always_inline u64 python_read_u64(const u8 *buf, u32 off)
{
    return *(const u64 *)(buf + (off & (PYTHON_FRAME_BUF - 1)));
}

static __always_inline u64 python_fnv(u64 hash, u64 value)
{
    hash ^= value;
    return hash * 0x100000001b3ULL;
}

/* The kernel tid a thread state names (0: unreadable). Branch-free: the
 * tid's address (in the thread state, or in struct pthread on 3.10) is
 * picked by mask. */
static __always_inline u32 python_tstate_tid(const struct python_layout *layout, u64 tstate)
{
    u64 word = 0;
    if (bpf_probe_read_user(&word, sizeof(word), (void *)(tstate + layout->tstate_tid)))
        return 0;
    u64 via_pthread = (layout->flags & PYTHON_LAYOUT_PTHREAD_TID) ? ~0ULL : 0;
    u64 at = ((word + layout->pthread_tid) & via_pthread) | ((tstate + layout->tstate_tid) & ~via_pthread);
    u32 tid = 0;
    if (bpf_probe_read_user(&tid, sizeof(tid), (void *)at))
        return 0;
    return tid;
}

/* The thread state of thread tid, from the interpreter's own thread list:
 * for a thread user space has not listed yet (started since its last
 * refresh). 0 when none of the first PYTHON_MAX_THREADS_SCANNED names it. */
static __always_inline u64 python_find_tstate(const struct python_layout *layout, u32 tid)
{
    u64 tstate = 0;
    if (layout->interp == 0 ||
        bpf_probe_read_user(&tstate, sizeof(tstate), (void *)(layout->interp + layout->interp_threads_head)))
        return 0;
    u32 next_off = layout->tstate_next;
    for (u32 i = 0; i < PYTHON_MAX_THREADS_SCANNED; i++) {
        if (tstate == 0)
            break;
        if (python_tstate_tid(layout, tstate) == tid)
            return tstate;
        if (bpf_probe_read_user(&tstate, sizeof(tstate), (void *)(tstate + next_off)))
            break;
    }
    return 0;
}

/* Fills out->frames innermost first; returns the depth (0: no Python frame
 * or nothing readable). 3.12+'s CSTACK shim frames are kept (user space
 * drops them, after using them to split the eval loop's C calls). */
static __always_inline u32 python_walk(const struct python_layout *layout, u64 tstate,
                                       struct python_stack *out, struct python_frame_buf *scratch)
{
    u8 *buf = scratch->bytes;
    u64 frame = 0;
    if (layout->flags & PYTHON_LAYOUT_CFRAME) {
        u64 cframe = 0;
        if (bpf_probe_read_user(&cframe, sizeof(cframe), (void *)(tstate + layout->tstate_frame)) || !cframe)
            return 0;
        if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(cframe + layout->cframe_frame)))
            return 0;
    } else if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(tstate + layout->tstate_frame))) {
        return 0;
    }

    /* in [1, PYTHON_FRAME_BUF], in a form the verifier can bound */
    u32 size = ((layout->frame_read - 1) & (PYTHON_FRAME_BUF - 1)) + 1;
    u32 code_off = layout->frame_code, previous_off = layout->frame_previous;
    u32 instr_off = layout->frame_instr, entry_off = layout->frame_entry & (PYTHON_FRAME_BUF - 1);
    u32 depth = 0;
    u64 hash = 0xcbf29ce484222325ULL;
    for (u32 i = 0; i < PYTHON_MAX_FRAMES; i++) {
        if (frame == 0)
            break;
        if (bpf_probe_read_user(buf, size, (void *)frame))
            break;
        u64 code = python_read_u64(buf, code_off) | ((u64)buf[entry_off] << 56);
        u64 instr = python_read_u64(buf, instr_off);
        frame = python_read_u64(buf, previous_off);
        out->frames[i].code = code;
        out->frames[i].instr = instr;
        hash = python_fnv(python_fnv(hash, code), instr);
        depth = i + 1;
    }
    out->depth = depth;
    out->hash = hash;
    out->check = (u32)(hash >> 32);
    return depth;
}

#endif /* INFERPROBE_PYTHON_FRAMES_BPF_H */
