/* body_windows.bpf.h: scanning a write longer than the head, a window at a time.
 *
 * Holds next_body_window: the head moves on by SCAN_HEAD_BYTES less
 * WINDOW_OVERLAP (inferprobe.h; collector/shared_constants.py states the
 * same geometry for user space), up to MAX_BODY_WINDOWS for a plain buffer
 * and MAX_VECTORED_WINDOWS for iovecs (filled by gather_window). Needs
 * struct scratch (scratch.bpf.h) and load8 (scan_bytes.bpf.h). Called by
 * scan_body and scan_fields (sock.bpf.c), which tail-call the next window's
 * program: any protocol's body scan gets its windows this way.
 */
#ifndef INFERPROBE_BODY_WINDOWS_BPF_H
#define INFERPROBE_BODY_WINDOWS_BPF_H

/* Moves the head to the next window of a long write: the last
 * WINDOW_OVERLAP bytes of this one, then what follows them in the write (a
 * plain buffer's next bytes, or the next iovecs'). Returns 0 when this
 * window was the last to scan. A write longer than the windows counts the
 * lines in them; its end is still read as a tail (scan_tail). */
static __always_inline int next_body_window(struct scratch *s)
{
    if (!s->more)
        return 0;
    u32 n = s->n;   /* >= WINDOW_OVERLAP: a shorter window sets no `more` */
#pragma unroll
    for (u32 k = 0; k < WINDOW_OVERLAP; k += 8) {
        u64 carried = load8(s->head, n - WINDOW_OVERLAP + k);
        *(u64 *)&s->head[k] = carried;
    }
    s->window_start += n - WINDOW_OVERLAP;
    s->windows++;
    /* What scan_fields counts (empty events) it counts once: in the overlap
     * only if it did not scan the window before. */
    s->fields_fresh_from = s->fields_saw_window ? WINDOW_OVERLAP : 0;
    s->fields_saw_window = 0;
    /* An "event:" line whose data line is in the next window: its name moves
     * with the bytes (one cut before the overlap is lost, and its data counts
     * as unnamed). */
    u32 name_at = s->event_name_at;
    s->event_name_at = name_at > n - WINDOW_OVERLAP ? name_at - (n - WINDOW_OVERLAP) : 0;
    /* Newlines from here: lines starting at or after WINDOW_OVERLAP - 11,
     * which the window before could not see whole ("data: [DONE]"). */
    s->body_start = WINDOW_OVERLAP - 12;
    if (s->ev.flags & HTTP_FLAG_VECTORED)
        return 1;   /* gather_window fills the rest of the window */
    /* A plain buffer is its own last buffer (copy_buffer): last_base and
     * last_len are the whole write. */
    u64 at = (u64)s->window_start + WINDOW_OVERLAP;   /* the first byte not yet in a window */
    u64 rest = s->last_len - at;
    u32 fresh = rest > SCAN_HEAD_BYTES - WINDOW_OVERLAP ? SCAN_HEAD_BYTES - WINDOW_OVERLAP : (u32)rest;
    if (fresh > 0 && fresh <= SCAN_HEAD_BYTES - WINDOW_OVERLAP)
        bpf_probe_read_user(&s->head[WINDOW_OVERLAP], fresh, (void *)(s->last_base + at));
    s->n = WINDOW_OVERLAP + fresh;
    s->tail_in_head = rest == fresh;   /* the end of the write is in view */
    s->more = rest > fresh && s->windows < MAX_BODY_WINDOWS;
    return 1;
}

#endif /* INFERPROBE_BODY_WINDOWS_BPF_H */
