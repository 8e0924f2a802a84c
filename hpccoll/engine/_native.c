/* The compiled shared-memory programs of engine/code.py, executed in C.
 *
 * code.run interprets a plan's instructions in Python: per instruction a dispatch, the
 * caller's slices made, a NumPy call.  On a 64 KiB allreduce at 2 ranks that Python is
 * about a third of the collective.  Here the same instructions, encoded once per plan by
 * code.native() as rows of NROW int64, run in one call until a flag wait that does not
 * hold yet, or the end.  The GIL stays held (the loop is short, and letting go of it
 * hands the caller's thread to the switch interval of whoever takes it).
 *
 * Row 0 is a header: MAGIC, then the bytes each of the call's three buffers (send,
 * recv, scratch) must hold at least, then whether the program writes the receive buffer
 * (a broadcast's root passes one buffer, which only its sends read: it may be
 * read-only); it is checked at every call, so an encoding never writes past a buffer it
 * was not made for, nor asks more of a buffer than the program needs.  Instruction i is row i + 1:
 *
 *   WAIT    epoch, npeers, &counter...      every counter >= base + epoch, else stop here
 *   SIGNAL  epoch, &counter                 counter = base + epoch
 *   COPY    dst, src, nbytes                copy_bytes (regions never overlap)
 *   REDUCE  dst, count, fn, nsrc, src...    dst = src0 (op) src1 (op) src2 ... in order
 *   PUBLISH kind, &word                     word = the address of the call's buffer kind
 *   READ    dst, &word, pid, off, nbytes    process pid's bytes at word + off to dst, by
 *                                           process_vm_readv (one copy: transport/cma.py)
 *   WRITE   src, &word, pid, off, nbytes    src to process pid's bytes at word + off, by
 *                                           process_vm_writev
 *
 * An operand is two words: kind 0-2 (the call's send, recv or scratch buffer) and a
 * byte offset into it, or kind 3 and an absolute address (node-shared memory).
 *
 * Memory ordering (transport/shm.py): a writer stores its data, a full fence, then the
 * counter (release); a reader loads the counter (acquire) and fences before the data.
 * These are the same fences the Python executor gets from MPI_Win_sync.
 *
 * Reductions are elementwise, in the order NumPy's ufuncs apply them, so results are
 * bit for bit NumPy's: integer sum and prod wrap (computed unsigned: signed overflow is
 * undefined in C), float sum and prod in the array's own type (no -ffast-math).  Float
 * max and min are left to NumPy (NaN and signed-zero rules); so are the low-precision
 * types, avg, and every other op: code.native() returns None for such programs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#if defined(__linux__)
#include <sys/uio.h>     /* process_vm_readv, _writev (READ, WRITE) */
#endif
#if defined(__x86_64__)
#include <emmintrin.h>   /* SSE2's streaming stores (stream_copy) */
#endif

#define NROW 40   /* a reduction of up to 17 sources, a wait on up to 37 peers */
#define MAGIC 0x68706363  /* "hpcc" */

enum { OP_WAIT = 0, OP_SIGNAL = 1, OP_COPY = 2, OP_REDUCE = 3, OP_PUBLISH = 4, OP_READ = 5,
       OP_WRITE = 6 };

/* AVX2 and SSE2 builds of the loops below, picked at load time (GCC's ifunc): the
 * reductions and copies are elementwise, so every build gives the same bits */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

typedef void (*reduce_fn)(void *, const void *, const void *, int64_t);

#define BINARY(NAME, T, EXPR)                                                     \
    VECTOR_CLONES                                                                 \
    static void NAME(void *dv, const void *av, const void *bv, int64_t n) {       \
        T *d = (T *)dv;                                                           \
        const T *a = (const T *)av, *b = (const T *)bv;                           \
        for (int64_t i = 0; i < n; i++) {                                         \
            T x = a[i], y = b[i];                                                 \
            d[i] = (EXPR);                                                        \
        }                                                                         \
    }

/* integers: sum, prod (unsigned arithmetic, two's complement wrap), max, min */
#define INTS(S, T, U)                                                             \
    BINARY(sum_##S, T, (T)((U)x + (U)y))                                          \
    BINARY(prod_##S, T, (T)((U)x * (U)y))                                         \
    BINARY(max_##S, T, x >= y ? x : y)                                            \
    BINARY(min_##S, T, x <= y ? x : y)
INTS(i8, int8_t, uint8_t)
INTS(i16, int16_t, uint16_t)
INTS(i32, int32_t, uint32_t)
INTS(i64, int64_t, uint64_t)
INTS(u8, uint8_t, uint8_t)
INTS(u16, uint16_t, uint16_t)
INTS(u32, uint32_t, uint32_t)
INTS(u64, uint64_t, uint64_t)
BINARY(sum_f32, float, x + y)
BINARY(prod_f32, float, x * y)
BINARY(sum_f64, double, x + y)
BINARY(prod_f64, double, x * y)

/* indexed by code.py's NATIVE_FNS: dtype-major, then sum, prod, max, min */
static const reduce_fn FNS[] = {
    sum_i8, prod_i8, max_i8, min_i8,     sum_i16, prod_i16, max_i16, min_i16,
    sum_i32, prod_i32, max_i32, min_i32, sum_i64, prod_i64, max_i64, min_i64,
    sum_u8, prod_u8, max_u8, min_u8,     sum_u16, prod_u16, max_u16, min_u16,
    sum_u32, prod_u32, max_u32, min_u32, sum_u64, prod_u64, max_u64, min_u64,
    sum_f32, prod_f32, NULL, NULL,       sum_f64, prod_f64, NULL, NULL,
};
#define NFNS ((int64_t)(sizeof(FNS) / sizeof(FNS[0])))

/* Copies in 32-byte vectors, not glibc's memcpy: from 2 KiB up to its L2-sized stop
 * threshold (512 KiB on the AMD EPYC VMs we run on) glibc's memcpy is `rep movsb`, and
 * there `rep movsb` into a slot the other core read a moment ago, or out of one it just
 * wrote, ran 2-3x slower than a vector loop: a 1 MiB allreduce at 2 ranks with 512 KiB
 * slots spent 550 us in memcpy against 165 us when its copies were 512 KiB (the vector
 * loop), 850-1170 us a call against 260-530 with rep movsb turned off by
 * GLIBC_TUNABLES.  The loop is 4 vectors deep, loads before stores. */
typedef char vec32 __attribute__((vector_size(32), aligned(1), may_alias));

VECTOR_CLONES
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void copy_bytes(char *restrict d, const char *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        vec32 a = *(const vec32 *)(s + i), b = *(const vec32 *)(s + i + 32);
        vec32 c = *(const vec32 *)(s + i + 64), e = *(const vec32 *)(s + i + 96);
        *(vec32 *)(d + i) = a;
        *(vec32 *)(d + i + 32) = b;
        *(vec32 *)(d + i + 64) = c;
        *(vec32 *)(d + i + 96) = e;
    }
    if (i < n)
        memcpy(d + i, s + i, n - i);
}

/* Copies into the receive buffer of a collective whose result is at least stream_bytes
 * (4 MiB: past what the caches keep of it anyway) use non-temporal stores: the result
 * goes to memory without first reading each destination line in (16 MiB private to
 * private on our EPYC VMs: 1.5-1.9 ms against 2.4-2.6 with the vector loop; at 1 MiB
 * no gain).
 *
 * Copies of slot_stream_bytes (32 KiB) or more into node-shared memory (a slot, a peer's
 * registered buffer) stream too, where the result does not (run): the lines they rewrite were read by a peer's core a call
 * ago, and a cached store must first take each line back from that core's cache, one at
 * a time in effect: 64 KiB took 10 us (33-38 us where the host placed the two cores far
 * apart) against 2 us streamed (scripts/floor_handoff.py measures it).  2 ranks, mpi4py's
 * blocking calls interleaved in one job, three jobs: allreduce 64 KiB 2.28x against
 * 1.89x, 256 KiB 1.85x against 1.56x, 1 MiB 1.63x against 1.18x (4 MiB 1.08x against
 * 1.18x); allgather 256 KiB 4.0x against 1.04x; gather 256 KiB 1.09x against 0.26x, 1 MiB
 * 1.33x against 0.25x; scatter 64 KiB 1.58x against 0.46x; 4 ranks: allreduce 64 KiB
 * 2.91x against 1.73x, allgather 256 KiB 2.54x against 1.77x.  (16 KiB rows even or
 * behind: scatter 16 KiB 1.16x against 1.28x; gather 256 KiB, whose root copies out what
 * one peer copied in, 0.82x against 0.94x in one phase of the host, where cached stores
 * were at 0.26x in the other; where two vCPUs share one core's L2 cached stores won in a
 * C loop of the handoff, 128 KiB 5 against 17 us, a placement MPI's core binding
 * avoids.)  Copies of slot_stream_limit or more stay cached (-1: none).  A context sets
 * both from how fast a cache line goes between the node's cores (engine/code.py:
 * SLOT_STREAMING; where they share caches a peer reads cached copies from there). */
static int64_t stream_bytes = 4 << 20;
static int64_t slot_stream_bytes = 32 << 10;
static int64_t slot_stream_limit = -1;

#if defined(__x86_64__)
#define CAN_STREAM 1
static void stream_copy(char *restrict d, const char *restrict s, size_t n) {
    size_t head = (size_t)(-(uintptr_t)d & 15);   /* streaming stores need 16-byte alignment */
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();   /* (the next SIGNAL's fence orders them too; this keeps it local) */
    if (i < n)
        memcpy(d + i, s + i, n - i);
}
#else
#define CAN_STREAM 0
#define stream_copy copy_bytes
#endif

/* OSError(err, message), errno attribute set (a peer's buffer not where this rank expects
 * it, EFAULT, is how ranks that disagree on a root look here: engine/task.py). */
static void os_error(int err, PyObject *message) {
    if (message == NULL)
        return;
    PyObject *args = Py_BuildValue("(iN)", err, message);
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
}

/* A peer's bytes, read (write 0) or written (write 1) where they lie in its process; the
 * kernel may stop short at a page it cannot take at once: go on from there.  0, or the
 * errno. */
static int move_peer(int write, char *here, int64_t pid, int64_t there, int64_t n) {
#if defined(__linux__)
    while (n > 0) {
        struct iovec local = {here, (size_t)n}, remote = {(void *)(intptr_t)there, (size_t)n};
        ssize_t got = write ? process_vm_writev((pid_t)pid, &local, 1, &remote, 1, 0)
                            : process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
        if (got <= 0)
            return got < 0 ? errno : EIO;
        here += got, there += got, n -= got;
    }
    return 0;
#else
    return n > 0 ? ENOSYS : 0;
#endif
}

static inline char *at(char *const *bufs, int64_t kind, int64_t off) {
    return kind == 3 ? (char *)(intptr_t)off : bufs[kind] + off;
}

/* Whether WAIT instruction ins holds: every flag it names has reached base + its epoch
 * (acquire: what the peer wrote before its signal is visible once this holds) */
static inline int wait_holds(const int64_t *ins, int64_t base) {
    int64_t v = base + ins[1];
    for (int64_t i = 0; i < ins[2]; i++)
        if (__atomic_load_n((int64_t *)(intptr_t)ins[3 + i], __ATOMIC_ACQUIRE) < v)
            return 0;
    return 1;
}

/* run(code, pc, base, send, recv, scratch) -> (pc, flag waits passed), or None where
 * pc > 0 is a WAIT that still does not hold (nothing done, the caller's state stands)
 * Executes from instruction pc until a WAIT that does not hold or the end (pc = count). */
/* A buffer argument's memory: an int is its address (engine/lane.py and program.py pass
 * a kept Call's arrays so: the caller holds them, checked against the plan's count when
 * the Call was made; *len is then -1, nothing to check), anything else is exported with
 * ``flags`` into *b (b->obj stays NULL for an address: PyBuffer_Release(b) is safe
 * either way).  -1 with the error set. */
static int arg_memory(PyObject *o, int flags, Py_buffer *b, char **p, Py_ssize_t *len) {
    b->obj = NULL;
    if (PyLong_CheckExact(o)) {
        *p = PyLong_AsVoidPtr(o);
        if (*p == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a null address");
            return -1;
        }
        *len = -1;
        return 0;
    }
    if (PyObject_GetBuffer(o, b, flags) < 0)
        return -1;
    *p = b->buf;
    *len = b->len;
    return 0;
}

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (fast-call: a waiter calls this once per program per poll) */
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(code, pc, base, send, recv, scratch)");
        return NULL;
    }
    PyObject *code_o = args[0], *obj[3] = {args[3], args[4], args[5]};
    Py_ssize_t pc = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (pc == -1 && PyErr_Occurred())
        return NULL;
    long long base = PyLong_AsLongLong(args[2]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer cv, bv[3];
    int held = 0;
    long waits = 0;
    if (PyObject_GetBuffer(code_o, &cv, PyBUF_SIMPLE) < 0)
        return NULL;
    const int64_t *code = cv.buf;
    Py_ssize_t count = cv.len / (NROW * 8) - 1;
    if (count < 0 || code[0] != MAGIC || pc < 0 || pc > count) {
        PyErr_SetString(PyExc_ValueError, "native run: not an encoded program, or pc out of range");
        goto fail;
    }
    /* most polls of a waiter find the program still waiting where it stopped: None,
     * before the call's buffers are exported (their sizes were checked by the first
     * call, at pc 0) */
    if (pc > 0 && pc < count && code[(pc + 1) * NROW] == OP_WAIT
            && !wait_holds(code + (pc + 1) * NROW, base)) {
        PyBuffer_Release(&cv);
        Py_RETURN_NONE;
    }
    char *bufs[3];
    for (int i = 0; i < 3; i++) {
        Py_ssize_t len = 0;
        bufs[i] = NULL;
        if (obj[i] != Py_None) {   /* (None: a reduce's recvbuf off its root) */
            int flags = (i == 2 || (i == 1 && code[4])) ? PyBUF_WRITABLE : PyBUF_SIMPLE;
            if (arg_memory(obj[i], flags, &bv[held], &bufs[i], &len) < 0)
                goto fail;
            if (bv[held].obj != NULL)
                held++;
        }
        if (len >= 0 && len < code[1 + i]) {
            PyErr_Format(PyExc_ValueError, "native run: buffer %d holds %zd bytes, the "
                         "program needs %lld", i, len, (long long)code[1 + i]);
            goto fail;
        }
    }
    /* (code[2]: the bytes of the receive buffer the program uses) */
    const int stream = CAN_STREAM && stream_bytes >= 0 && code[2] >= stream_bytes;
    /* (where the result streams, the pipeline cycles its slots faster than a peer's
     * caches keep them: 4 MiB allreduce 1.41x MPI slots streamed, 1.52x cached) */
    const int64_t slot_stream = CAN_STREAM && !stream && slot_stream_bytes >= 0
                                ? slot_stream_bytes : INT64_MAX;
    const int64_t slot_below = slot_stream_limit >= 0 ? slot_stream_limit : INT64_MAX;
    for (; pc < count; pc++) {
        const int64_t *ins = code + (pc + 1) * NROW;
        switch (ins[0]) {
        case OP_WAIT:
            if (!wait_holds(ins, base))
                goto stop;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* counter before data */
            waits++;
            break;
        case OP_SIGNAL:
            __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* data before counter */
            __atomic_store_n((int64_t *)(intptr_t)ins[2], base + ins[1], __ATOMIC_RELEASE);
            break;
        case OP_COPY:
            /* (kind 3, an address: a slot or a peer's registered buffer) */
            if ((stream && ins[1] == 1)
                    || (ins[1] == 3 && ins[5] >= slot_stream && ins[5] < slot_below))
                stream_copy(at(bufs, ins[1], ins[2]), at(bufs, ins[3], ins[4]), (size_t)ins[5]);
            else
                copy_bytes(at(bufs, ins[1], ins[2]), at(bufs, ins[3], ins[4]), (size_t)ins[5]);
            break;
        case OP_REDUCE: {
            reduce_fn fn = ins[4] >= 0 && ins[4] < NFNS ? FNS[ins[4]] : NULL;
            int64_t nsrc = ins[5];
            if (fn == NULL || nsrc < 2 || 6 + 2 * nsrc > NROW) {
                PyErr_SetString(PyExc_ValueError, "native run: bad reduction");
                goto fail;
            }
            char *d = at(bufs, ins[1], ins[2]);
            fn(d, at(bufs, ins[6], ins[7]), at(bufs, ins[8], ins[9]), ins[3]);
            for (int64_t s = 2; s < nsrc; s++)
                fn(d, d, at(bufs, ins[6 + 2 * s], ins[7 + 2 * s]), ins[3]);
            break;
        }
        case OP_PUBLISH:
            if (ins[1] < 0 || ins[1] > 2 || bufs[ins[1]] == NULL) {
                PyErr_SetString(PyExc_ValueError, "native run: bad buffer to publish");
                goto fail;
            }
            /* (the SIGNAL after it orders it before the counter the peers wait on) */
            *(int64_t *)(intptr_t)ins[2] = (int64_t)(intptr_t)bufs[ins[1]];
            break;
        case OP_READ:
        case OP_WRITE: {
            int write = ins[0] == OP_WRITE;
            int64_t there = __atomic_load_n((int64_t *)(intptr_t)ins[3], __ATOMIC_ACQUIRE);
            int err = move_peer(write, at(bufs, ins[1], ins[2]), ins[4], there + ins[5],
                                ins[6]);
            if (err) {
                os_error(err, PyUnicode_FromFormat(
                    "%s of %lld bytes %s process %lld: %s",
                    write ? "process_vm_writev" : "process_vm_readv", (long long)ins[6],
                    write ? "to" : "from", (long long)ins[4], strerror(err)));
                goto fail;
            }
            break;
        }
        default:
            PyErr_SetString(PyExc_ValueError, "native run: bad opcode");
            goto fail;
        }
    }
stop:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&bv[i]);
    PyBuffer_Release(&cv);
    return Py_BuildValue("(nl)", pc, waits);
fail:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&bv[i]);
    PyBuffer_Release(&cv);
    return NULL;
}

/* *var = arg; returns its previous value (the setters below) */
static PyObject *swap_bytes(int64_t *var, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    long long old = *var;
    *var = v;
    return PyLong_FromLongLong(old);
}

/* set_stream_bytes(n) -> previous: the receive-buffer size from which copies into it
 * stream (-1: never); for tests and measurements */
static PyObject *set_stream_bytes(PyObject *self, PyObject *arg) {
    return swap_bytes(&stream_bytes, arg);
}

/* set_slot_stream_bytes(n) -> previous: the copy size from which copies into
 * node-shared memory stream (-1: never); for tests and measurements */
static PyObject *set_slot_stream_bytes(PyObject *self, PyObject *arg) {
    return swap_bytes(&slot_stream_bytes, arg);
}

/* set_slot_stream_limit(n) -> previous: copies into node-shared memory of n bytes or
 * more do not stream (-1: no limit) */
static PyObject *set_slot_stream_limit(PyObject *self, PyObject *arg) {
    return swap_bytes(&slot_stream_limit, arg);
}

/* ---- Cells: small collectives in one handoff (engine/code.py: cells_layout) ----------
 *
 * Each rank of a node owns a ring of CELL_RING cells in its segment of the node-shared area
 * and one DONE line.  Collective seq of a communicator uses cell seq mod ring on every rank.
 * A cell is an 8-byte sequence word followed by the payload, so up to 56 bytes of data lie
 * in the same 64-byte line as the word that publishes them: one line moves per peer.
 *
 *   post: every peer's DONE >= seq - ring (acquire: it has read the cell this one reuses),
 *         else not yet (SEEN spares most of these loads); copy the input into my cell;
 *         store seq into its word (release).
 *   done: my DONE == seq - 1 (a rank completes its cells in order); every cell this rank
 *         reads holds seq (acquire); compute the result from the cells (my own included,
 *         so an input that is also the output is read before it is written); store seq
 *         into my DONE (release: my reads of the cells come before it).
 *
 * Release/acquire pairs order data before the word that publishes it, and a reader's loads
 * before the DONE that lets the writer reuse the cell; the words only grow (no reset, no ABA),
 * and a writer is never a whole ring ahead of a reader, so a reader waiting for seq sees
 * seq - ring or seq, never a later one.  No fence and no system call on the path: on
 * x86-64 release and acquire are plain moves.
 *
 * By reference (REF; a broadcast, gather or scatter larger than a cell, where every rank may
 * read the others' memory): a cell holds the writer's process id and the address of its
 * buffer instead of the data; a reader reads what it takes straight from there (one copy,
 * process_vm_readv) before it stores its DONE.  A writer's buffer must stay as it is until
 * every rank that reads it has done so: its done also waits, after its own reads and DONE,
 * for every such reader's DONE >= seq (its DONE at seq or later already: only that wait is
 * left; this rank's later cells may have completed their reads meanwhile).  A gather's
 * root copies its own block at its first try, before its peers' cells hold seq, and notes
 * it in its own cell's fourth word (no other rank reads that word).
 *
 * The layout (int64 words, CELL_FIELDS below, then the n ring bases, the n DONE addresses
 * and this rank's SEEN word) is made once per plan by engine/code.py, which checks these
 * names at import. */
enum { CK_ALLREDUCE, CK_REDUCE, CK_BROADCAST, CK_ALLGATHER, CK_REDUCE_SCATTER, CK_ALLTOALL,
       CK_BARRIER, CK_GATHER, CK_SCATTER, CK_COUNT };
static const char *const CELL_KIND_NAMES[] = {"allreduce", "reduce", "broadcast", "allgather",
                                              "reduce_scatter", "alltoall", "barrier",
                                              "gather", "scatter"};
enum { CF_MAGIC, CF_KIND, CF_RANK, CF_N, CF_ROOT, CF_RING, CF_STRIDE, CF_WRITE, CF_BLOCK,
       CF_FN, CF_COUNT, CF_RESULT, CF_REF, CF_PID, CF_HEADER };
static const char *const CELL_FIELD_NAMES[] = {"magic", "kind", "rank", "n", "root", "ring",
                                               "stride", "write", "block", "fn", "count",
                                               "result", "ref", "pid"};
#define CELL_MAGIC 0x63656c6c  /* "cell" */

static const int64_t *cell_layout(PyObject *o) {
    if (!PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "cells: the layout is bytes");
        return NULL;
    }
    const int64_t *L = (const int64_t *)PyBytes_AS_STRING(o);
    Py_ssize_t words = PyBytes_GET_SIZE(o) / 8;
    if (words < CF_HEADER || L[CF_MAGIC] != CELL_MAGIC || L[CF_N] < 1 ||
        words != CF_HEADER + 2 * L[CF_N] + 1 || L[CF_KIND] < 0 || L[CF_KIND] >= CK_COUNT ||
        L[CF_RING] < 2 || L[CF_RANK] < 0 || L[CF_RANK] >= L[CF_N] ||
        (L[CF_REF] && (L[CF_STRIDE] < 32 || (L[CF_KIND] != CK_BROADCAST &&
                                             L[CF_KIND] != CK_GATHER &&
                                             L[CF_KIND] != CK_SCATTER)))) {
        PyErr_SetString(PyExc_ValueError, "cells: not a cell layout");
        return NULL;
    }
    return L;
}

/* the root's cell is all there is to read (a broadcast, a scatter) */
static inline int from_root(const int64_t *L) {
    return L[CF_KIND] == CK_BROADCAST || L[CF_KIND] == CK_SCATTER;
}

/* The layout and sequence number of a cell call (its first two arguments), or NULL with
 * the error set. */
static const int64_t *cell_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                                const char *usage, int64_t *seq) {
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const int64_t *L = cell_layout(args[0]);
    if (L == NULL)
        return NULL;
    *seq = PyLong_AsLongLong(args[1]);
    return *seq == -1 && PyErr_Occurred() ? NULL : L;
}

static inline int cell_writes(const int64_t *L) {
    return !from_root(L) || L[CF_RANK] == L[CF_ROOT];
}

static inline int cell_reads(const int64_t *L) {
    switch (L[CF_KIND]) {
    case CK_REDUCE: case CK_GATHER: return L[CF_RANK] == L[CF_ROOT];
    case CK_BROADCAST: return L[CF_RANK] != L[CF_ROOT];
    default: return 1;
    }
}

/* The ranks whose cells this rank reads: [*q0, *q1) */
static inline void cell_span(const int64_t *L, int64_t *q0, int64_t *q1) {
    *q0 = from_root(L) ? L[CF_ROOT] : 0;
    *q1 = from_root(L) ? *q0 + 1 : L[CF_N];
}

static inline char *cell_at(const int64_t *L, int64_t q, int64_t seq) {
    return (char *)(intptr_t)L[CF_HEADER + q] + (seq % L[CF_RING]) * L[CF_STRIDE];
}

static inline int64_t *done_at(const int64_t *L, int64_t q) {
    return (int64_t *)(intptr_t)L[CF_HEADER + L[CF_N] + q];
}

/* The least DONE this rank saw of its peers when it last looked (a word of its own that
 * no peer reads): a writer loads its peers' DONE lines only when that is too old for the
 * cell it reuses, about once a ring, so those lines rarely move between cores. */
static inline int64_t *seen_at(const int64_t *L) {
    return (int64_t *)(intptr_t)L[CF_HEADER + 2 * L[CF_N]];
}

/* The ranks that read this rank's buffer by reference: [*q0, *q1) but this rank (a
 * gather's root reads every other rank's; every other rank reads a broadcast's or a
 * scatter's root's) */
static inline void ref_readers(const int64_t *L, int64_t *q0, int64_t *q1) {
    int64_t p = L[CF_RANK], root = L[CF_ROOT];
    *q0 = *q1 = 0;
    if (!L[CF_REF])
        return;
    if (L[CF_KIND] == CK_GATHER) {
        if (p != root)
            *q0 = root, *q1 = root + 1;
    } else if (p == root) {
        *q1 = L[CF_N];
    }
}

/* n bytes at offset off of the buffer rank q's cell seq refers to, into d (this rank's
 * own: a local copy, none where it is d itself, an in-place root's block).  0, or -1 with
 * the error set. */
static int ref_read(const int64_t *L, int64_t q, int64_t seq, char *d, int64_t off,
                    int64_t n) {
    const int64_t *c = (const int64_t *)cell_at(L, q, seq);
    char *src = (char *)(intptr_t)c[2] + off;
    if (q == L[CF_RANK]) {
        if (src != d)
            memmove(d, src, (size_t)n);
        return 0;
    }
    int err = move_peer(0, d, c[1], (int64_t)(intptr_t)src, n);
    if (err) {
        os_error(err, PyUnicode_FromFormat(
            "cells: process_vm_readv of %lld bytes from rank %lld (process %lld): %s",
            (long long)n, (long long)q, (long long)c[1], strerror(err)));
        return -1;
    }
    return 0;
}

/* n bytes at offset off of what rank q's cell seq holds into d: the cell's data, or by
 * reference the buffer it names.  0, or -1 with the error set. */
static inline int cell_take(const int64_t *L, int64_t q, int64_t seq, char *d, int64_t off,
                            int64_t n) {
    if (L[CF_REF])
        return ref_read(L, q, seq, d, off, n);
    memcpy(d, cell_at(L, q, seq) + 8 + off, (size_t)n);
    return 0;
}

/* cell_post(layout, seq, send) -> bool: this rank's part published (False: the ring is
 * full, a peer has not read the cell yet; try again) */
static PyObject *cell_post(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t seq;
    const int64_t *L = cell_args(args, nargs, 3, "cell_post(layout, seq, send)", &seq);
    if (L == NULL)
        return NULL;
    if (!cell_writes(L))
        Py_RETURN_TRUE;
    int64_t n = L[CF_N], reuse = seq - L[CF_RING];
    int64_t *seen = seen_at(L);
    if (reuse > *seen) {
        int64_t least = INT64_MAX;
        for (int64_t q = 0; q < n; q++) {
            int64_t d = __atomic_load_n(done_at(L, q), __ATOMIC_ACQUIRE);
            if (d < least)
                least = d;
        }
        *seen = least;
        if (least < reuse)
            Py_RETURN_FALSE;
    }
    char *cell = cell_at(L, L[CF_RANK], seq);
    int64_t nbytes = L[CF_WRITE];
    if (nbytes > 0) {
        Py_buffer b;
        char *src;
        Py_ssize_t len;
        if (arg_memory(args[2], PyBUF_SIMPLE, &b, &src, &len) < 0)
            return NULL;
        if (len >= 0 && len < nbytes) {
            PyBuffer_Release(&b);
            PyErr_Format(PyExc_ValueError, "cell_post: the input holds %zd bytes, %lld are "
                         "published", len, (long long)nbytes);
            return NULL;
        }
        if (L[CF_REF]) {   /* (the buffer's owner, the lane, holds it meanwhile) */
            ((int64_t *)cell)[1] = L[CF_PID];
            ((int64_t *)cell)[2] = (int64_t)(intptr_t)src;
        } else {
            memcpy(cell + 8, src, (size_t)nbytes);
        }
        PyBuffer_Release(&b);
    }
    __atomic_store_n((int64_t *)cell, seq, __ATOMIC_RELEASE);
    Py_RETURN_TRUE;
}

static void cell_fold(const int64_t *L, int64_t seq, char *d, int64_t off) {
    reduce_fn fn = FNS[L[CF_FN]];
    int64_t n = L[CF_N], count = L[CF_COUNT];
    if (n == 1) {
        memcpy(d, cell_at(L, 0, seq) + 8 + off, (size_t)L[CF_RESULT]);
        return;
    }
    /* in rank order on every rank: the same bits everywhere */
    fn(d, cell_at(L, 0, seq) + 8 + off, cell_at(L, 1, seq) + 8 + off, count);
    for (int64_t q = 2; q < n; q++)
        fn(d, d, cell_at(L, q, seq) + 8 + off, count);
}

/* The output memory of cell_done (its recv argument), which must hold result bytes: 0,
 * or -1 with the error set */
static int cell_out(PyObject *arg, int64_t result, Py_buffer *b, char **d) {
    Py_ssize_t len;
    if (arg_memory(arg, PyBUF_WRITABLE, b, d, &len) < 0)
        return -1;
    if (len >= 0 && len < result) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "cell_done: the output holds %zd bytes, the result "
                     "%lld", len, (long long)result);
        return -1;
    }
    return 0;
}

/* cell_done(layout, seq, recv) -> bool: the collective completed on this rank (False: a
 * cell it reads does not hold seq yet, or an earlier one has not completed here) */
static PyObject *cell_done(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t seq;
    const int64_t *L = cell_args(args, nargs, 3, "cell_done(layout, seq, recv)", &seq);
    if (L == NULL)
        return NULL;
    int64_t n = L[CF_N], p = L[CF_RANK];
    int64_t *mine = done_at(L, p);
    if (*mine >= seq && L[CF_REF])
        goto readers;          /* read already (later cells maybe too): its readers left */
    if (*mine != seq - 1)      /* (only this rank writes it) */
        Py_RETURN_FALSE;
    if (cell_reads(L)) {
        int64_t kind = L[CF_KIND], q0, q1;
        int64_t result = L[CF_RESULT], block = L[CF_BLOCK];
        Py_buffer b;
        char *d;
        int64_t *own = (int64_t *)cell_at(L, p, seq);
        if (L[CF_REF] && kind == CK_GATHER && own[3] != seq) {
            /* a gather's root copies its own block while its peers may still be on their
             * way, once (its own cell's fourth word, which no other rank reads, says so) */
            if (cell_out(args[2], result, &b, &d) < 0)
                return NULL;
            int failed = ref_read(L, p, seq, d + p * block, 0, block);
            PyBuffer_Release(&b);
            if (failed)
                return NULL;
            own[3] = seq;
        }
        cell_span(L, &q0, &q1);
        for (int64_t q = q0; q < q1; q++)
            if (__atomic_load_n((int64_t *)cell_at(L, q, seq), __ATOMIC_ACQUIRE) != seq)
                Py_RETURN_FALSE;
        if (result > 0) {
            if (cell_out(args[2], result, &b, &d) < 0)
                return NULL;
            int failed = 0;
            switch (kind) {
            case CK_ALLREDUCE:
            case CK_REDUCE:
                cell_fold(L, seq, d, 0);
                break;
            case CK_REDUCE_SCATTER:
                cell_fold(L, seq, d, p * block);
                break;
            case CK_BROADCAST:
                failed = cell_take(L, q0, seq, d, 0, result);
                break;
            case CK_SCATTER:
                failed = cell_take(L, q0, seq, d, p * block, block);
                break;
            case CK_ALLGATHER:
            case CK_GATHER:    /* (by reference, a gather's root copied its own above) */
                for (int64_t q = 0; q < n && !failed; q++)
                    if (!(L[CF_REF] && q == p))
                        failed = cell_take(L, q, seq, d + q * block, 0, block);
                break;
            case CK_ALLTOALL:
                for (int64_t q = 0; q < n; q++)
                    memcpy(d + q * block, cell_at(L, q, seq) + 8 + p * block, (size_t)block);
                break;
            }
            PyBuffer_Release(&b);
            if (failed)
                return NULL;
        }
    }
    __atomic_store_n(mine, seq, __ATOMIC_RELEASE);
readers: {
        int64_t q0, q1;
        ref_readers(L, &q0, &q1);
        for (int64_t q = q0; q < q1; q++)
            if (q != p && __atomic_load_n(done_at(L, q), __ATOMIC_ACQUIRE) < seq)
                Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* address(buffer, writable) -> int: where a buffer's memory starts (a call's send or
 * receive buffer, passed to cell_post, cell_done and run by its caller, which holds the
 * buffer, instead of the buffer: its export costs more than an 8 B cell's copy).  Where
 * it cannot be exported so (None, a read-only buffer asked to be writable: a broadcast's
 * root may pass one) the buffer itself, which those calls then export themselves, with
 * their own checks, where they use it. */
static PyObject *address(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "address(buffer, writable)");
        return NULL;
    }
    int writable = PyObject_IsTrue(args[1]);
    if (writable < 0)
        return NULL;
    Py_buffer b;
    if (args[0] == Py_None ||
            PyObject_GetBuffer(args[0], &b, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return Py_NewRef(args[0]);
    }
    PyObject *out = PyLong_FromVoidPtr(b.buf);
    PyBuffer_Release(&b);
    return out;
}

/* cell_waits(layout, seq) -> list: the ranks whose cell this rank still waits for, or
 * by reference, once its own reads are done, the ranks that have not read its buffer yet
 * (a report's pending peers) */
static PyObject *cell_waits(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t seq, q0, q1;
    const int64_t *L = cell_args(args, nargs, 2, "cell_waits(layout, seq)", &seq);
    if (L == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    int64_t p = L[CF_RANK];
    int readers = L[CF_REF] && (!cell_reads(L) || *done_at(L, p) >= seq);
    if (out == NULL || !(readers || cell_reads(L)))
        return out;
    if (readers)
        ref_readers(L, &q0, &q1);
    else
        cell_span(L, &q0, &q1);
    for (int64_t q = q0; q < q1; q++) {
        int waits = readers
            ? q != p && __atomic_load_n(done_at(L, q), __ATOMIC_ACQUIRE) < seq
            : __atomic_load_n((int64_t *)cell_at(L, q, seq), __ATOMIC_ACQUIRE) != seq;
        if (waits) {
            PyObject *v = PyLong_FromLongLong(q);
            if (v == NULL || PyList_Append(out, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    return out;
}

/* handoff(mine, peer, rounds, first, limit_ns) -> (ns, rounds done): a flag ping-pong
 * between two processes over two cache lines of node-shared memory (the floor under
 * every small collective): each round this side waits for the peer's flag to reach its
 * count, then stores its own.  A side still waiting limit_ns after it began (-1: no
 * limit) stores HANDOFF_STOP instead and returns; a side that sees HANDOFF_STOP stores it
 * too and returns, so neither waits for the other past the limit (a peer without a core:
 * the probe at context creation must not stall it).  Lines that saw a stop are not used
 * again.  engine/code.py: handoff_ns. */
#define HANDOFF_STOP INT64_MAX

static int handoff_wait(int64_t *mine, int64_t *peer, int64_t want,
                        const struct timespec *t0, long long limit) {
    unsigned spins = 0;
    int64_t got;
    while ((got = __atomic_load_n(peer, __ATOMIC_ACQUIRE)) < want) {
        if (limit >= 0 && (++spins & 1023) == 0) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((long long)(t.tv_sec - t0->tv_sec) * 1000000000LL + (t.tv_nsec - t0->tv_nsec)
                    > limit) {
                __atomic_store_n(mine, HANDOFF_STOP, __ATOMIC_RELEASE);
                return 0;
            }
        }
    }
    if (got == HANDOFF_STOP) {
        __atomic_store_n(mine, HANDOFF_STOP, __ATOMIC_RELEASE);
        return 0;
    }
    return 1;
}

static PyObject *handoff(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "handoff(mine, peer, rounds, first, limit_ns)");
        return NULL;
    }
    int64_t *mine = (int64_t *)(intptr_t)PyLong_AsLongLong(args[0]);
    int64_t *peer = (int64_t *)(intptr_t)PyLong_AsLongLong(args[1]);
    long long rounds = PyLong_AsLongLong(args[2]);
    int first = PyObject_IsTrue(args[3]);
    long long limit = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    int64_t base = __atomic_load_n(mine, __ATOMIC_ACQUIRE);
    struct timespec t0, t1;
    long long done = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (base != HANDOFF_STOP) {
        for (long long i = 1; i <= rounds; i++) {
            if (!first && !handoff_wait(mine, peer, base + i, &t0, limit))
                break;
            __atomic_store_n(mine, base + i, __ATOMIC_RELEASE);
            if (first && !handoff_wait(mine, peer, base + i, &t0, limit))
                break;
            done = i;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return Py_BuildValue("LL", (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
                         (t1.tv_nsec - t0.tv_nsec), done);
}

/* Lock: threading.Lock's acquire, release, locked and with, for the per-call path's two
 * locks (a communicator's state, the engine's driver).  threading.Lock's acquire parses
 * its (blocking, timeout) arguments with PyArg_ParseTupleAndKeywords on every call, about
 * 450 instructions, twice per small collective; this one reads them by position and
 * takes the same PyThread lock (engine/lane.py: new_lock).  A wait lets go of the GIL
 * and is interruptible, as threading.Lock's is. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked;
} LockObject;

static PyObject *Lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    LockObject *self = (LockObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lock = PyThread_allocate_lock();
    self->locked = 0;
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void Lock_dealloc(LockObject *self) {
    if (self->lock != NULL) {
        if (self->locked)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* acquire(blocking=True, timeout=-1) -> bool */
static PyObject *Lock_acquire(LockObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    int blocking = 1;
    double timeout = -1;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 2) {
        PyErr_SetString(PyExc_TypeError, "acquire() takes at most 2 arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        int is_timeout = i < nargs ? i == 1 : 0;
        if (i >= nargs) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i - nargs);
            if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0)
                is_timeout = 1;
            else if (PyUnicode_CompareWithASCIIString(name, "blocking") != 0) {
                PyErr_Format(PyExc_TypeError, "acquire() got an unexpected keyword argument "
                             "'%U'", name);
                return NULL;
            }
        }
        if (is_timeout) {
            timeout = PyFloat_AsDouble(args[i]);
            if (timeout == -1 && PyErr_Occurred())
                return NULL;
        } else if ((blocking = PyObject_IsTrue(args[i])) < 0) {
            return NULL;
        }
    }
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout > (double)PY_TIMEOUT_MAX * 1e-6) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    PyLockStatus r = PyThread_acquire_lock_timed(self->lock, 0, 0);
    if (r != PY_LOCK_ACQUIRED && blocking && timeout != 0) {
        double end = timeout < 0 ? 0 : mono_s() + timeout;
        for (;;) {
            PY_TIMEOUT_T us = -1;
            if (timeout >= 0) {
                double left = end - mono_s();
                us = left > 0 ? (PY_TIMEOUT_T)(left * 1e6) : 0;
            }
            Py_BEGIN_ALLOW_THREADS
            r = PyThread_acquire_lock_timed(self->lock, us, 1);
            Py_END_ALLOW_THREADS
            if (r != PY_LOCK_INTR)
                break;
            if (Py_MakePendingCalls() < 0)     /* a signal handler raised (Ctrl-C) */
                return NULL;
        }
    }
    if (r != PY_LOCK_ACQUIRED)
        Py_RETURN_FALSE;
    self->locked = 1;
    Py_RETURN_TRUE;
}

static PyObject *Lock_release(LockObject *self, PyObject *unused) {
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    Py_RETURN_NONE;
}

static PyObject *Lock_enter(LockObject *self, PyObject *unused) {
    return Lock_acquire(self, NULL, 0, NULL);
}

static PyObject *Lock_exit(LockObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return Lock_release(self, NULL);
}

static PyObject *Lock_locked(LockObject *self, PyObject *unused) {
    return PyBool_FromLong(self->locked);
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool, as threading.Lock's"},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, "release(), as threading.Lock's"},
    {"locked", (PyCFunction)Lock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Lock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpccoll.engine._native.Lock",
    .tp_basicsize = sizeof(LockObject),
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A mutex with threading.Lock's interface (acquire, release, locked, with).",
    .tp_methods = Lock_methods,
    .tp_new = Lock_new,
};

static PyMethodDef methods[] = {
    {"set_slot_stream_limit", set_slot_stream_limit, METH_O,
     "set_slot_stream_limit(n) -> previous: copies into node-shared memory of n bytes or "
     "more do not stream (-1: no limit)"},
    {"set_slot_stream_bytes", set_slot_stream_bytes, METH_O,
     "set_slot_stream_bytes(n) -> previous: copies of n bytes or more into node-shared "
     "memory use non-temporal stores (-1: never); for tests and measurements"},
    {"set_stream_bytes", set_stream_bytes, METH_O,
     "set_stream_bytes(n) -> previous: copies into a receive buffer of n bytes or more use "
     "non-temporal stores (-1: never)"},
    {"cell_post", (PyCFunction)(void (*)(void))cell_post, METH_FASTCALL,
     "cell_post(layout, seq, send) -> bool: publish this rank's part of cell collective seq "
     "(send: a buffer, or its address)"},
    {"cell_done", (PyCFunction)(void (*)(void))cell_done, METH_FASTCALL,
     "cell_done(layout, seq, recv) -> bool: complete cell collective seq on this rank (recv: "
     "a buffer, or its address)"},
    {"address", (PyCFunction)(void (*)(void))address, METH_FASTCALL,
     "address(buffer, writable) -> int: where the buffer's memory starts"},
    {"cell_waits", (PyCFunction)(void (*)(void))cell_waits, METH_FASTCALL,
     "cell_waits(layout, seq) -> list: the ranks whose cell this rank still waits for"},
    {"handoff", (PyCFunction)(void (*)(void))handoff, METH_FASTCALL,
     "handoff(mine, peer, rounds, first, limit_ns) -> (ns, rounds done): a flag ping-pong "
     "between two processes"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(code, pc, base, send, recv, scratch) -> (pc, waits): execute an encoded "
     "shared-memory program from pc until a flag wait that does not hold, or the end"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hpccoll.engine._native",
                                    "engine/code.py's programs executed in C", -1, methods};

/* The tables engine/code.py encodes against, exported so that it checks them at import
 * (its own definitions are the source: a build out of step with them is refused). */
static const char *const DTYPE_NAMES[] = {"i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                          "f4", "f8"};
static const char *const OP_NAMES[] = {"sum", "prod", "max", "min"};
static PyObject *names(const char *const *arr, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++) {
        PyObject *s = PyUnicode_FromString(arr[i]);
        if (s == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}
#define NAMES(arr) names(arr, (Py_ssize_t)(sizeof(arr) / sizeof(arr[0])))

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&LockType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Lock", (PyObject *)&LockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *opcodes = Py_BuildValue("{sisisisisisisi}", "WAIT", OP_WAIT, "SIGNAL",
                                      OP_SIGNAL, "COPY", OP_COPY, "REDUCE", OP_REDUCE,
                                      "PUBLISH", OP_PUBLISH, "READ", OP_READ, "WRITE",
                                      OP_WRITE);
    PyObject *dtypes = NAMES(DTYPE_NAMES), *ops = NAMES(OP_NAMES);
    PyObject *kinds = NAMES(CELL_KIND_NAMES), *fields = NAMES(CELL_FIELD_NAMES);
    if (opcodes == NULL || dtypes == NULL || ops == NULL || kinds == NULL || fields == NULL ||
        PyModule_AddObjectRef(m, "CELL_KINDS", kinds) < 0 ||
        PyModule_AddObjectRef(m, "CELL_FIELDS", fields) < 0 ||
        PyModule_AddIntConstant(m, "CELL_MAGIC", CELL_MAGIC) < 0 ||
        PyModule_AddIntConstant(m, "NROW", NROW) < 0 ||
        PyModule_AddIntConstant(m, "MAGIC", MAGIC) < 0 ||
        PyModule_AddObjectRef(m, "OPCODES", opcodes) < 0 ||
        PyModule_AddObjectRef(m, "DTYPES", dtypes) < 0 ||
        PyModule_AddObjectRef(m, "OPS", ops) < 0 ||
        PyModule_AddIntConstant(m, "NFNS", (long)NFNS) < 0) {
        Py_XDECREF(opcodes);
        Py_XDECREF(dtypes);
        Py_XDECREF(ops);
        Py_XDECREF(kinds);
        Py_XDECREF(fields);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(kinds);
    Py_DECREF(fields);
    Py_DECREF(opcodes);
    Py_DECREF(dtypes);
    Py_DECREF(ops);
    return m;
}
